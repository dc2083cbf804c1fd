// kqp's own launcher for Kroxylicious' proxy runtime: Maven Central serves
// io.kroxylicious:kroxylicious-runtime but not the kroxylicious-app that carries the project's
// command line, so bench/proxy_throughput.py compiles this file with javac (harness/kroxylicious.py)
// and runs it on the runtime's jars.
//
//     java -cp LIBS/*:CLASSES KroxyliciousLauncher CONFIG.yaml
//
// It reads the runtime's YAML configuration, starts the proxy with the default feature set (no
// unlocked test-only features) and blocks until the JVM is stopped (SIGTERM runs the JVM's
// shutdown, which is all a benchmark needs). Startup failures exit non-zero with the cause on
// stderr, so the harness can show them.

import java.io.InputStream;
import java.nio.file.Files;
import java.nio.file.Path;

import io.kroxylicious.proxy.KafkaProxy;
import io.kroxylicious.proxy.config.ConfigParser;
import io.kroxylicious.proxy.config.Configuration;
import io.kroxylicious.proxy.internal.config.Features;

public final class KroxyliciousLauncher {

    private KroxyliciousLauncher() {
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 1) {
            System.err.println("usage: KroxyliciousLauncher CONFIG.yaml");
            System.exit(2);
        }
        // The parser is also the plugin registry the proxy looks filters up in (none here).
        ConfigParser parser = new ConfigParser();
        Configuration configuration;
        try (InputStream yaml = Files.newInputStream(Path.of(args[0]))) {
            configuration = parser.parseConfiguration(yaml);
        }
        try (KafkaProxy proxy = new KafkaProxy(parser, configuration, Features.defaultFeatures())) {
            proxy.startup();
            System.out.println("kroxylicious started");
            System.out.flush();
            proxy.block();
        }
    }
}
