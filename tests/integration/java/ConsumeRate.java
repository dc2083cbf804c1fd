// Kafka's own KafkaConsumer reading a topic for a while and printing the value bytes it got
// in each second, so a test can measure the rate a consumer quota holds it to. Run as a
// single-file source program:
//   java -cp '<kafka libs>/*' ConsumeRate.java BOOTSTRAP TOPIC GROUP CLIENT_ID START_EPOCH_MS SECONDS
// Seconds count from START_EPOCH_MS (wall clock), so several consumers' counts line up.
// Prints "second <i> <bytes>" lines for i = 0 .. SECONDS-1.
import java.time.Duration;
import java.util.List;
import java.util.Properties;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

public class ConsumeRate {
    public static void main(String[] args) {
        Properties props = new Properties();
        props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(ConsumerConfig.GROUP_ID_CONFIG, args[2]);
        props.put(ConsumerConfig.CLIENT_ID_CONFIG, args[3]);
        props.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        long start = Long.parseLong(args[4]);
        int seconds = Integer.parseInt(args[5]);
        long[] perSecond = new long[seconds];
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(props)) {
            consumer.subscribe(List.of(args[1]));
            while (true) {
                ConsumerRecords<byte[], byte[]> records = consumer.poll(Duration.ofMillis(100));
                long second = (System.currentTimeMillis() - start) / 1000;
                if (second >= seconds) {
                    break;
                }
                if (second >= 0) {
                    for (ConsumerRecord<byte[], byte[]> record : records) {
                        perSecond[(int) second] += record.serializedValueSize();
                    }
                }
            }
        }
        for (int i = 0; i < seconds; i++) {
            System.out.printf("second %d %d%n", i, perSecond[i]);
        }
    }
}
