// Kafka's own Java clients, each configured with the library's defaults, in the shapes the
// system test's calibration runs measure (bench/calibration.py): what each got through a
// broker-side quota, as an operator counts it. Run as a single-file source program:
//   java -cp '<kafka libs>/*' CalibrationClients.java produce BOOTSTRAP TOPIC CLIENT_ID OFFER_BYTES_PER_S SECONDS WARMUP_S
//   java -cp '<kafka libs>/*' CalibrationClients.java consume BOOTSTRAP TOPIC CLIENT_ID SECONDS WARMUP_S
//   java -cp '<kafka libs>/*' CalibrationClients.java admin BOOTSTRAP CLIENT_ID PARTITIONS SECONDS WARMUP_S
// Each prints "counted <value bytes or partitions>" (acknowledged, delivered or created inside
// seconds [WARMUP_S, SECONDS) only: what was still queued at the end is dropped, not counted),
// "error <class>" per failed record or topic, and "metric <name> <value>" for the client's
// own metrics at the warm-up's end ("metric-start") and at the end.
import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.TreeMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.Metric;
import org.apache.kafka.common.MetricName;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class CalibrationClients {
    static final int RECORD_SIZE = 1024;
    static final Map<String, Long> errors = new TreeMap<>();

    public static void main(String[] args) throws Exception {
        switch (args[0]) {
            case "produce" -> produce(args[1], args[2], args[3], Double.parseDouble(args[4]),
                    Integer.parseInt(args[5]), Integer.parseInt(args[6]));
            case "consume" -> consume(args[1], args[2], args[3], Integer.parseInt(args[4]), Integer.parseInt(args[5]));
            case "admin" -> admin(args[1], args[2], Integer.parseInt(args[3]), Integer.parseInt(args[4]),
                    Integer.parseInt(args[5]));
            default -> throw new IllegalArgumentException("unknown mode " + args[0]);
        }
        synchronized (errors) {
            errors.forEach((name, count) -> System.out.printf("error %s %d%n", name, count));
        }
    }

    static synchronized void error(Throwable e) {
        synchronized (errors) {
            errors.merge(e.getClass().getSimpleName(), 1L, Long::sum);
        }
    }

    // The client's metrics of one group ("producer-metrics", "consumer-fetch-manager-metrics",
    // ...) that have no tags but the client-id: the client's totals.
    static void printMetrics(String prefix, Map<MetricName, ? extends Metric> metrics, List<String> groups) {
        for (Map.Entry<MetricName, ? extends Metric> entry : metrics.entrySet()) {
            MetricName name = entry.getKey();
            if (groups.contains(name.group()) && name.tags().size() == 1 && name.tags().containsKey("client-id")) {
                Object value = entry.getValue().metricValue();
                if (value instanceof Double) {
                    System.out.printf("%s %s:%s %s%n", prefix, name.group(), name.name(), value);
                }
            }
        }
    }

    static void produce(String bootstrap, String topic, String clientId, double offered, int seconds, int warmup) {
        Properties props = new Properties();
        props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ProducerConfig.CLIENT_ID_CONFIG, clientId);
        props.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        props.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        AtomicLong counted = new AtomicLong();
        byte[] payload = new byte[RECORD_SIZE];
        List<String> groups = List.of("producer-metrics");
        KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(props);
        long start = System.nanoTime();
        long sent = 0;
        boolean started = false;
        while (true) {
            double elapsed = (System.nanoTime() - start) / 1e9;
            if (elapsed >= seconds) {
                break;
            }
            if (!started && elapsed >= warmup) {
                printMetrics("metric-start", producer.metrics(), groups);
                started = true;
            }
            // The offer: records as the seconds pass; send() blocks when buffer.memory is full,
            // as an application's send does.
            while (sent * RECORD_SIZE < offered * elapsed) {
                producer.send(new ProducerRecord<>(topic, payload), (metadata, exception) -> {
                    double at = (System.nanoTime() - start) / 1e9;
                    if (exception != null) {
                        if (at < seconds) {  // not the backlog close(ZERO) drops at the end
                            error(exception);
                        }
                    } else if (at >= warmup && at < seconds) {
                        counted.addAndGet(RECORD_SIZE);
                    }
                });
                sent++;
            }
            sleepMs(2);
        }
        printMetrics("metric", producer.metrics(), groups);
        System.out.printf("counted %d%n", counted.get());
        System.out.flush();
        producer.close(Duration.ZERO);  // the backlog is dropped, not counted
    }

    static void consume(String bootstrap, String topic, String clientId, int seconds, int warmup) {
        Properties props = new Properties();
        props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ConsumerConfig.GROUP_ID_CONFIG, clientId + "-group");
        props.put(ConsumerConfig.CLIENT_ID_CONFIG, clientId);
        props.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        long counted = 0;
        List<String> groups = List.of("consumer-fetch-manager-metrics", "consumer-metrics");
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(props)) {
            consumer.subscribe(List.of(topic));
            long start = System.nanoTime();
            boolean started = false;
            while (true) {
                ConsumerRecords<byte[], byte[]> records = consumer.poll(Duration.ofMillis(100));
                double elapsed = (System.nanoTime() - start) / 1e9;
                if (elapsed >= seconds) {
                    break;
                }
                if (!started && elapsed >= warmup) {
                    printMetrics("metric-start", consumer.metrics(), groups);
                    started = true;
                }
                if (elapsed >= warmup) {
                    for (ConsumerRecord<byte[], byte[]> record : records) {
                        counted += record.serializedValueSize();
                    }
                }
            }
            printMetrics("metric", consumer.metrics(), groups);
        }
        System.out.printf("counted %d%n", counted);
    }

    // Topics created one after another, each of PARTITIONS partitions, as a provisioning script
    // does; the admin client retries a topic refused with THROTTLING_QUOTA_EXCEEDED by itself
    // (retry.on.quota.violation), after the throttle time the broker gave.
    static void admin(String bootstrap, String clientId, int partitions, int seconds, int warmup) throws Exception {
        Properties props = new Properties();
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(AdminClientConfig.CLIENT_ID_CONFIG, clientId);
        long counted = 0;
        List<String> groups = List.of("admin-client-metrics");
        try (Admin admin = Admin.create(props)) {
            long start = System.nanoTime();
            boolean started = false;
            for (int i = 0; ; i++) {
                double elapsed = (System.nanoTime() - start) / 1e9;
                if (elapsed >= seconds) {
                    break;
                }
                if (!started && elapsed >= warmup) {
                    printMetrics("metric-start", admin.metrics(), groups);
                    started = true;
                }
                try {
                    admin.createTopics(List.of(new NewTopic(clientId + "-" + i, partitions, (short) 1))).all().get();
                    double at = (System.nanoTime() - start) / 1e9;
                    if (at >= warmup && at < seconds) {
                        counted += partitions;
                    }
                } catch (ExecutionException e) {
                    error(e.getCause());
                }
            }
            printMetrics("metric", admin.metrics(), groups);
        }
        System.out.printf("counted %d%n", counted);
    }

    static void sleepMs(long ms) {
        try {
            Thread.sleep(ms);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }
}
