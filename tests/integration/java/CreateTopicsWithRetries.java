// Kafka's own AdminClient creating topics, retrying on THROTTLING_QUOTA_EXCEEDED as it does by
// default (retryOnQuotaViolation). Run as a single-file source program:
//   java -cp '<kafka libs>/*' CreateTopicsWithRetries.java BOOTSTRAP CLIENT_ID PARTITIONS TOPIC...
// Prints "created <topic> <seconds>" per topic, exits non-zero if any creation failed.
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.CreateTopicsResult;
import org.apache.kafka.clients.admin.NewTopic;

public class CreateTopicsWithRetries {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(AdminClientConfig.CLIENT_ID_CONFIG, args[1]);
        props.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "240000");
        props.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, "30000");
        int partitions = Integer.parseInt(args[2]);
        List<NewTopic> topics = new ArrayList<>();
        for (int i = 3; i < args.length; i++) {
            topics.add(new NewTopic(args[i], partitions, (short) 1));
        }
        long start = System.nanoTime();
        int failed = 0;
        try (Admin admin = Admin.create(props)) {
            CreateTopicsResult result = admin.createTopics(topics);
            for (Map.Entry<String, ?> entry : result.values().entrySet()) {
                try {
                    result.values().get(entry.getKey()).get();
                    System.out.printf("created %s %.1f%n", entry.getKey(), (System.nanoTime() - start) / 1e9);
                } catch (Exception e) {
                    failed++;
                    System.out.printf("failed %s %s%n", entry.getKey(), e.getCause());
                }
            }
        }
        System.exit(failed == 0 ? 0 : 1);
    }
}
