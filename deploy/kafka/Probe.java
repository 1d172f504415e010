// Readiness probe for deploy/kafka/start.sh: exits 0 once the broker at args[0]
// answers a metadata request (Admin.describeCluster) and reports at least one broker.
// Run with the single-file source launcher: java -cp 'var/kafka/lib/*' Probe.java HOST:PORT

import java.util.Collection;
import java.util.Properties;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.common.Node;

public class Probe {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, args.length > 0 ? args[0] : "127.0.0.1:9092");
        props.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, "5000");
        props.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "5000");
        try (Admin admin = Admin.create(props)) {
            Collection<Node> nodes = admin.describeCluster().nodes().get(6, TimeUnit.SECONDS);
            String controller = String.valueOf(admin.describeCluster().controller().get(6, TimeUnit.SECONDS));
            System.out.println("kafka.ready brokers=" + nodes.size() + " controller=" + controller);
            System.exit(nodes.isEmpty() ? 1 : 0);
        } catch (Exception e) {
            System.out.println("kafka.not_ready error=" + e);
            System.exit(1);
        }
    }
}
