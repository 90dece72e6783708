package io.github.outboxd.apicurio;

import java.util.List;

import javax.enterprise.inject.Produces;
import javax.inject.Singleton;

import io.apicurio.common.apps.config.DynamicConfigPropertyList;

/**
 * The bean apicurio-common-app-components-config-index's build step makes
 * (the list of run-time editable properties), whose deployment module Maven
 * Central does not serve: here it is empty, so every property is static.
 */
public class DynamicConfigProducer {
    @Produces
    @Singleton
    DynamicConfigPropertyList dynamicConfigPropertyList() {
        return new DynamicConfigPropertyList(List.of());
    }
}
