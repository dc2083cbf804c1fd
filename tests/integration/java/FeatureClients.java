// Kafka's own Java clients using the newer protocol features, for the transparency tests.
// Run as a single-file source program:
//   java -cp '<kafka libs>/*' FeatureClients.java MODE BOOTSTRAP TOPIC ...
// Modes:
//   consume BOOTSTRAP TOPIC GROUP EXPECTED [key=value ...]
//       KafkaConsumer (subscribe, poll, commitSync) until EXPECTED records; prints "consumed N".
//   share-consume BOOTSTRAP TOPIC GROUP EXPECTED SECONDS [IDLE_SECONDS]
//       KafkaShareConsumer (share group), acknowledging every record, until it has EXPECTED
//       records, or it has some and none came for IDLE_SECONDS, or SECONDS pass; prints
//       "share-consumed N" and each value as "value V" lines. Sets the group's
//       share.auto.offset.reset=earliest first.
//   txn-produce BOOTSTRAP TOPIC COMMITTED ABORTED
//       A transactional producer: COMMITTED records "c<i>" in a committed transaction and
//       ABORTED records "a<i>" in an aborted one; prints "committed N aborted M".
//   produce BOOTSTRAP TOPIC COUNT RATE [key=value ...]
//       An idempotent acks=all KafkaProducer sending the values "0" .. COUNT-1 at about RATE
//       records/s; waits for every acknowledgement and prints "produced N" (N acknowledged).
//       Exits non-zero if any send failed. key=value: further producer settings (e.g. TLS).
//   streams BOOTSTRAP IN OUT APPID PROTOCOL EXPECTED SECONDS
//       A Kafka Streams app (processing.guarantee=exactly_once_v2, group.protocol=PROTOCOL:
//       classic or streams) copying IN to OUT with each value V written as "s-V", until it has
//       processed EXPECTED records or SECONDS pass; then closes (committing) and prints
//       "processed N". Exits non-zero if the app fails.
import java.time.Duration;
import java.util.List;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;
import java.util.Map;
import java.util.Properties;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.consumer.AcknowledgeType;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.KafkaShareConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.serialization.StringSerializer;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;

public class FeatureClients {
    public static void main(String[] args) throws Exception {
        switch (args[0]) {
            case "consume" -> consume(args);
            case "share-consume" -> shareConsume(args);
            case "txn-produce" -> txnProduce(args);
            case "streams" -> streams(args);
            case "produce" -> produce(args);
            default -> throw new IllegalArgumentException("unknown mode " + args[0]);
        }
    }

    static void consume(String[] args) {
        Properties props = new Properties();
        props.put("bootstrap.servers", args[1]);
        props.put("group.id", args[3]);
        props.put("auto.offset.reset", "earliest");
        props.put("enable.auto.commit", "false");
        props.put("key.deserializer", StringDeserializer.class.getName());
        props.put("value.deserializer", StringDeserializer.class.getName());
        for (int i = 5; i < args.length; i++) {
            String[] kv = args[i].split("=", 2);
            props.put(kv[0], kv[1]);
        }
        long expected = Long.parseLong(args[4]);
        long count = 0;
        long deadline = System.currentTimeMillis() + 120_000;
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(props)) {
            consumer.subscribe(List.of(args[2]));
            while (count < expected && System.currentTimeMillis() < deadline) {
                ConsumerRecords<String, String> records = consumer.poll(Duration.ofMillis(500));
                for (ConsumerRecord<String, String> record : records) {
                    System.out.println("value " + record.value());
                    count++;
                }
                if (!records.isEmpty()) {
                    consumer.commitSync();
                }
            }
            // Anything past the expected count would show up here.
            ConsumerRecords<String, String> extra = consumer.poll(Duration.ofSeconds(2));
            count += extra.count();
            consumer.commitSync();
        }
        System.out.println("consumed " + count);
    }

    static void shareConsume(String[] args) throws Exception {
        String bootstrap = args[1];
        String group = args[3];
        try (Admin admin = Admin.create(Map.of("bootstrap.servers", bootstrap))) {
            ConfigResource resource = new ConfigResource(ConfigResource.Type.GROUP, group);
            AlterConfigOp op = new AlterConfigOp(new ConfigEntry("share.auto.offset.reset", "earliest"),
                                                 AlterConfigOp.OpType.SET);
            admin.incrementalAlterConfigs(Map.of(resource, List.of(op))).all().get();
        }
        Properties props = new Properties();
        props.put("bootstrap.servers", bootstrap);
        props.put("group.id", group);
        props.put("share.acknowledgement.mode", "explicit");
        props.put("key.deserializer", StringDeserializer.class.getName());
        props.put("value.deserializer", StringDeserializer.class.getName());
        long expected = Long.parseLong(args[4]);
        long deadline = System.currentTimeMillis() + Long.parseLong(args[5]) * 1000;
        long idleMs = args.length > 6 ? Long.parseLong(args[6]) * 1000 : Long.MAX_VALUE / 2;
        long lastRecordAt = System.currentTimeMillis();
        long count = 0;
        try (KafkaShareConsumer<String, String> consumer = new KafkaShareConsumer<>(props)) {
            consumer.subscribe(List.of(args[2]));
            while (count < expected && System.currentTimeMillis() < deadline
                   && !(count > 0 && System.currentTimeMillis() - lastRecordAt > idleMs)) {
                ConsumerRecords<String, String> records = consumer.poll(Duration.ofMillis(500));
                if (!records.isEmpty()) {
                    lastRecordAt = System.currentTimeMillis();
                }
                for (ConsumerRecord<String, String> record : records) {
                    System.out.println("value " + record.value());
                    consumer.acknowledge(record, AcknowledgeType.ACCEPT);
                    count++;
                }
                if (!records.isEmpty()) {
                    consumer.commitSync();
                }
            }
        }
        System.out.println("share-consumed " + count);
    }

    static void txnProduce(String[] args) {
        Properties props = new Properties();
        props.put("bootstrap.servers", args[1]);
        props.put("transactional.id", args[2] + "-txn");
        props.put("key.serializer", StringSerializer.class.getName());
        props.put("value.serializer", StringSerializer.class.getName());
        int committed = Integer.parseInt(args[3]);
        int aborted = Integer.parseInt(args[4]);
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(props)) {
            producer.initTransactions();
            producer.beginTransaction();
            for (int i = 0; i < committed; i++) {
                producer.send(new ProducerRecord<>(args[2], "c" + i));
            }
            producer.commitTransaction();
            producer.beginTransaction();
            for (int i = 0; i < aborted; i++) {
                producer.send(new ProducerRecord<>(args[2], "a" + i));
            }
            producer.flush();
            producer.abortTransaction();
        }
        System.out.println("committed " + committed + " aborted " + aborted);
    }

    static void streams(String[] args) throws Exception {
        Properties props = new Properties();
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, args[1]);
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, args[4]);
        props.put(StreamsConfig.GROUP_PROTOCOL_CONFIG, args[5]);
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
        props.put(StreamsConfig.DEFAULT_KEY_SERDE_CLASS_CONFIG, Serdes.StringSerde.class.getName());
        props.put(StreamsConfig.DEFAULT_VALUE_SERDE_CLASS_CONFIG, Serdes.StringSerde.class.getName());
        props.put(StreamsConfig.STATE_DIR_CONFIG,
                  java.nio.file.Files.createTempDirectory("kqp-streams-").toString());
        props.put(StreamsConfig.consumerPrefix("auto.offset.reset"), "earliest");
        long expected = Long.parseLong(args[6]);
        long deadline = System.currentTimeMillis() + Long.parseLong(args[7]) * 1000;
        AtomicLong processed = new AtomicLong();
        AtomicReference<Throwable> failure = new AtomicReference<>();
        StreamsBuilder builder = new StreamsBuilder();
        builder.<String, String>stream(args[2])
               .peek((key, value) -> processed.incrementAndGet())
               .mapValues(value -> "s-" + value)
               .to(args[3]);
        KafkaStreams streams = new KafkaStreams(builder.build(), props);
        streams.setUncaughtExceptionHandler(error -> {
            failure.compareAndSet(null, error);
            return StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        streams.start();
        try {
            while (processed.get() < expected && failure.get() == null
                   && System.currentTimeMillis() < deadline) {
                Thread.sleep(100);
            }
        } finally {
            streams.close(Duration.ofSeconds(60));
        }
        System.out.println("processed " + processed.get());
        if (failure.get() != null) {
            failure.get().printStackTrace();
            System.exit(1);
        }
    }

    static void produce(String[] args) throws Exception {
        Properties props = new Properties();
        props.put("bootstrap.servers", args[1]);
        props.put("acks", "all");
        props.put("enable.idempotence", "true");
        props.put("linger.ms", "5");
        props.put("delivery.timeout.ms", "120000");
        props.put("key.serializer", StringSerializer.class.getName());
        props.put("value.serializer", StringSerializer.class.getName());
        for (int i = 5; i < args.length; i++) {
            String[] kv = args[i].split("=", 2);
            props.put(kv[0], kv[1]);
        }
        int count = Integer.parseInt(args[3]);
        double rate = Double.parseDouble(args[4]);
        AtomicLong acked = new AtomicLong();
        AtomicReference<Exception> failure = new AtomicReference<>();
        long start = System.nanoTime();
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(props)) {
            for (int i = 0; i < count; i++) {
                long due = start + (long) (i * 1e9 / rate);
                long wait = due - System.nanoTime();
                if (wait > 0) {
                    Thread.sleep(wait / 1_000_000, (int) (wait % 1_000_000));
                }
                producer.send(new ProducerRecord<>(args[2], Integer.toString(i)), (metadata, error) -> {
                    if (error != null) {
                        failure.compareAndSet(null, error);
                    } else {
                        acked.incrementAndGet();
                    }
                });
            }
            producer.flush();
        }
        System.out.println("produced " + acked.get());
        if (failure.get() != null) {
            failure.get().printStackTrace();
            System.exit(1);
        }
    }
}
