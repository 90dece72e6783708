package rabbitmq

// ContentTypeHeader is the header the router's CloudEvents envelope puts the
// content type in (router.CEAMQP.ContentType): datacontenttype in binary
// mode, application/cloudevents+json in structured mode. The AMQP protocol
// binding maps it to the message's content-type property, which message sets
// from it (the header stays too, for consumers that read only headers).
const ContentTypeHeader = "content-type"
