package fault

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/test/harness"
)

// kafkaKind picks the broker of the world: kfake (one fake broker process
// behind one proxy, broker.go), apache (one Apache Kafka KRaft node behind
// one proxy: the whole-broker faults of kfake on the real broker) or
// apache-cluster (three Apache Kafka KRaft nodes, each behind its own proxy,
// topics at RF 3 / min ISR 2).
var kafkaKind = flag.String("kafka", "", "broker: kfake, apache or apache-cluster (default: $"+harness.EnvKafkaKind+", else kfake)")

func worldKafkaKind() (string, error) {
	k := *kafkaKind
	if k == "" {
		k = os.Getenv(harness.EnvKafkaKind)
	}
	switch k {
	case "", harness.KindKfake:
		return harness.KindKfake, nil
	case harness.KindApache, harness.KindApacheCluster:
		return k, nil
	}
	return "", fmt.Errorf("-kafka %q: the fault suite runs on kfake, apache or apache-cluster", k)
}

// faultKafka is the world's broker side, whatever its kind. Whole-cluster
// operations act on every broker.
type faultKafka interface {
	Start(ctx context.Context) error
	Stop() error
	Pause() error
	Resume() error
	Close()
	Exited() bool          // a broker died by itself
	LogTail() string       // for a failed test
	ClientOpts() []kgo.Opt // the test's own clients: straight to the brokers, never through the proxies
	replicas() int16       // replication factor of the test topics
}

func (b *Broker) LogTail() string {
	return fmt.Sprintf("broker log tail (%s):\n%s", b.LogFile(), fileTail(b.LogFile(), 4<<10))
}

func (b *Broker) ClientOpts() []kgo.Opt {
	return []kgo.Opt{kgo.SeedBrokers(b.Addr()), kgo.Dialer(b.DialRedirect())}
}

func (b *Broker) replicas() int16 { return 1 }

// apacheCluster is an Apache Kafka cluster (3 nodes, or 1 for -kafka
// apache) whose nodes advertise one proxy each.
type apacheCluster struct {
	*harness.ApacheKafka
	proxies []*Proxy
}

func startApacheCluster(ctx context.Context, proxies []*Proxy) (*apacheCluster, error) {
	var adv []string
	for _, p := range proxies {
		adv = append(adv, p.Addr())
	}
	c, err := harness.StartApacheKafka(ctx, len(proxies), harness.WithAdvertisedAddrs(adv...), harness.WithPartitions(partitions))
	if err != nil {
		return nil, fmt.Errorf("starting broker: %w", err)
	}
	for i, nd := range c.Nodes() {
		proxies[i].SetTarget(nd.Addr())
	}
	return &apacheCluster{ApacheKafka: c, proxies: proxies}, nil
}

func (a *apacheCluster) Exited() bool {
	for _, nd := range a.Nodes() {
		if nd.Exited() {
			return true
		}
	}
	return false
}

func (a *apacheCluster) LogTail() string {
	var b strings.Builder
	for _, nd := range a.Nodes() {
		fmt.Fprintf(&b, "apache kafka node %d log tail (%s):\n%s\n", nd.ID, nd.LogFile(), fileTail(nd.LogFile(), 3<<10))
	}
	return b.String()
}

func (a *apacheCluster) ClientOpts() []kgo.Opt {
	var seeds []string
	for _, nd := range a.Nodes() {
		seeds = append(seeds, nd.Addr())
	}
	return []kgo.Opt{kgo.SeedBrokers(seeds...), kgo.Dialer(a.DialRedirect())}
}

func (a *apacheCluster) replicas() int16 { return int16(min(3, len(a.Nodes()))) }

// checkProductionSettings verifies what the suite claims about the
// cluster: three replicas per partition, min.insync.replicas 2, no unclean
// leader election, no auto-creation, a transaction log at RF 3 / min ISR 2.
func (a *apacheCluster) checkProductionSettings(ctx context.Context, adm *kadm.Client, topics []string) error {
	md, err := adm.Metadata(ctx, topics...)
	if err != nil {
		return err
	}
	if n := len(md.Brokers); n != 3 {
		return fmt.Errorf("cluster: %d brokers in metadata, want 3", n)
	}
	for _, t := range topics {
		for _, p := range md.Topics[t].Partitions {
			if len(p.Replicas) != 3 {
				return fmt.Errorf("cluster: %s/%d has replicas %v, want 3", t, p.Partition, p.Replicas)
			}
		}
	}
	want := map[string]string{"min.insync.replicas": "2", "unclean.leader.election.enable": "false"}
	tc, err := adm.DescribeTopicConfigs(ctx, topics...)
	if err != nil {
		return err
	}
	for _, rc := range tc {
		if err := hasConfigs(rc, want); err != nil {
			return fmt.Errorf("cluster: topic %s: %w", rc.Name, err)
		}
	}
	bc, err := adm.DescribeBrokerConfigs(ctx, 1)
	if err != nil {
		return err
	}
	for _, rc := range bc {
		if err := hasConfigs(rc, map[string]string{"auto.create.topics.enable": "false",
			"transaction.state.log.replication.factor": "3", "transaction.state.log.min.isr": "2"}); err != nil {
			return fmt.Errorf("cluster: broker %s: %w", rc.Name, err)
		}
	}
	return nil
}

func hasConfigs(rc kadm.ResourceConfig, want map[string]string) error {
	if rc.Err != nil {
		return rc.Err
	}
	got := map[string]string{}
	for _, c := range rc.Configs {
		if c.Value != nil {
			got[c.Key] = *c.Value
		}
	}
	for k, v := range want {
		if got[k] != v {
			return fmt.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	return nil
}

// waitFullISR waits until every partition of topics has all its replicas in
// sync: the point where a rolling restart may take the next node down.
func (a *apacheCluster) waitFullISR(ctx context.Context, topics []string) error {
	cl, err := kgo.NewClient(a.ClientOpts()...)
	if err != nil {
		return err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	for {
		md, err := adm.Metadata(ctx, topics...)
		if err == nil {
			err = fullISR(md, topics)
		}
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("replicas not back in sync: %w (last: %v)", ctx.Err(), err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func fullISR(md kadm.Metadata, topics []string) error {
	for _, t := range topics {
		td, ok := md.Topics[t]
		if !ok || td.Err != nil {
			return fmt.Errorf("topic %s: %v", t, td.Err)
		}
		for _, p := range td.Partitions {
			if p.Leader < 0 || len(p.ISR) < len(p.Replicas) {
				return fmt.Errorf("%s/%d: leader %d, ISR %v of %v", t, p.Partition, p.Leader, p.ISR, p.Replicas)
			}
		}
	}
	return nil
}

// multiProxy applies a fault to every broker's proxy at once.
type multiProxy []*Proxy

func (m multiProxy) Cut(d time.Duration) {
	for _, p := range m {
		p.Cut(d)
	}
}

func (m multiProxy) Stall() {
	for _, p := range m {
		p.Stall()
	}
}

func (m multiProxy) Pass() {
	for _, p := range m {
		p.Pass()
	}
}

func (m multiProxy) Delay(d time.Duration) {
	for _, p := range m {
		p.Delay(d)
	}
}

func (m multiProxy) Blackhole() {
	for _, p := range m {
		p.Blackhole()
	}
}

func (m multiProxy) Stats() (accepted, refused int64) {
	for _, p := range m {
		a, r := p.Stats()
		accepted, refused = accepted+a, refused+r
	}
	return accepted, refused
}

func (m multiProxy) Close() {
	for _, p := range m {
		p.Close()
	}
}

// Addrs is the list outboxd bootstraps from.
func (m multiProxy) Addrs() string {
	var a []string
	for _, p := range m {
		a = append(a, p.Addr())
	}
	return strings.Join(a, ",")
}

// proxyFaults is what the proxy faults need of one proxy or several.
type proxyFaults interface {
	Cut(d time.Duration)
	Stall()
	Pass()
	Delay(d time.Duration)
	Blackhole()
	Stats() (accepted, refused int64)
}

var errNotCluster = errors.New("this fault needs -kafka apache-cluster")
