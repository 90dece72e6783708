package main

import "testing"

func TestRabbitMQFlags(t *testing.T) {
	runValidateCases{
		"amqp":               {[]string{"--broker", "amqp://u:secret@127.0.0.1:5672/vh", "--rabbitmq-key-in-routing-key"}, ""},
		"amqps":              {[]string{"--broker", "amqps://u:secret@h:5671/", "--rabbitmq-exchange", "events"}, ""},
		"exactly-once":       {[]string{"--broker", "amqp://u:secret@h:5672/", "--exactly-once"}, "rabbitmq: exactly-once mode is not available"},
		"amqps exactly-once": {[]string{"--broker", "amqps://h:5671/", "--exactly-once"}, "remove --exactly-once"},
		"exchange type":      {[]string{"--broker", "amqp://h/", "--rabbitmq-exchange-type", "x-consistent-hash"}, `--rabbitmq-exchange-type "x-consistent-hash": one of topic, direct, fanout, headers`},
		"default exchange":   {[]string{"--broker", "amqp://h/", "--rabbitmq-exchange", ""}, "--rabbitmq-exchange is empty"},
		"progress queue":     {[]string{"--broker", "amqp://h/", "--rabbitmq-progress-queue", "amq.p"}, "--rabbitmq-progress-queue must be a queue name that does not start with amq."},
		"tls pair":           {[]string{"--broker", "amqps://h/", "--rabbitmq-tls-cert", "c.pem"}, "--rabbitmq-tls-cert and --rabbitmq-tls-key go together"},
	}.run(t)
}
