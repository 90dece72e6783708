package schema_test

import (
	"context"
	"fmt"

	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"

	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/schema"
)

// The relay's stage and the consumer's half: an Encoder turns an outbox
// payload into the Confluent wire format by the topic's subject; a Decoder
// (an inbox handler's) reads it back.
func Example() {
	reg := srfake.New() // a Confluent-compatible registry
	defer reg.Close()
	reg.SeedSchema("orders-value", 1, 1, sr.Schema{Schema: `{"type":"record","name":"Order","fields":[{"name":"id","type":"string"},{"name":"qty","type":"int"}]}`})
	cl, _ := sr.NewClient(sr.URLs(reg.URL()))

	enc, _ := schema.New(schema.Config{Client: cl}) // topic strategy: subject "orders-value"
	rec := &router.Record{Topic: "orders", Value: []byte(`{"id":"o-1","qty":2}`)}
	if err := enc.Encode(context.Background(), "public.outbox", rec); err != nil {
		fmt.Println(err)
	}
	fmt.Printf("% x\n", rec.Value)

	bad := &router.Record{Topic: "orders", Value: []byte(`{"id":"o-2","qty":"two"}`)}
	fmt.Println(enc.Encode(context.Background(), "public.outbox", bad))

	var order struct {
		ID  string
		Qty int
	}
	_ = schema.NewDecoder(cl).Decode(context.Background(), rec.Value, &order)
	fmt.Printf("%+v\n", order)
	// Output:
	// 00 00 00 00 01 06 6f 2d 31 04
	// outbox event in public.outbox cannot be routed: the payload does not match AVRO schema id 1 (subject orders-value version 1): field qty: want an integer (Avro int), got a string
	// {ID:o-1 Qty:2}
}
