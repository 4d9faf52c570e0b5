//! Every file in tests/invalid/ fails with exactly the listed `LINE:COL: message` lines.

const EXPECTED: &[(&str, &[&str])] = &[
    (
        "bad-checked.yaml",
        &[
            "4:19: capabilities[0]: \"https://10.0.0.1\": the check compares the name the connection carries with a granted name: an address or \"*\" names none (https://NAME or https://NAME:PORT, NAME a host name or *.SUFFIX: \"https://api.example.com\", \"https://*.example.com:8443\")",
            "4:39: capabilities[0]: \"https://api.example.test/v1\": no path, query or user: the grant is a host and a port (https://NAME or https://NAME:PORT, NAME a host name or *.SUFFIX: \"https://api.example.com\", \"https://*.example.com:8443\")",
            "4:70: capabilities[0]: \"http://*:80\": the check compares the name the connection carries with a granted name: an address or \"*\" names none (http://NAME or http://NAME:PORT, NAME a host name or *.SUFFIX: \"http://api.example.com\", \"http://*.example.com:8443\")",
            "4:85: capabilities[0]: \"https://a.example.test:*\": the port must be 1-65535 (no \"*\": the check names one service) (https://NAME or https://NAME:PORT, NAME a host name or *.SUFFIX: \"https://api.example.com\", \"https://*.example.com:8443\")",
            "5:16: capabilities[1]: \"http://localhost:80\": https:// and http:// declare a check of the names connections carry, for net.connect only",
        ],
    ),
    (
        "bad-disk.yaml",
        &[
            "3:9: compute.disk: memory \"lots\" is not a size (write \"2GiB\", \"512MiB\" or a number of bytes)",
            "4:16: compute.disk_inodes: must be positive, found 0",
        ],
    ),
    (
        "bad-io.yaml",
        &[
            "4:17: compute.io[0].device: \"sda\" is neither a path under /dev/ nor MAJOR:MINOR",
            "5:7: compute.io[1]: no limit: give at least one of rbps, wbps, riops, wiops",
            "6:31: compute.io[2].riops: must be positive, found 0",
            "6:40: compute.io[2].wbps: memory \"fast\" is not a size (write \"2GiB\", \"512MiB\" or a number of bytes)",
        ],
    ),
    (
        "bad-name.yaml",
        &[
            "1:7: name: \"Doc_RAG\" is not a valid agent name: use 1-63 lower-case letters, digits and '-', starting with a letter or digit (it becomes a cgroup directory and a D-Bus object path)",
            "2:9: tenant: \"../etc\" is not a valid tenant name: use 1-63 lower-case letters, digits and '-', starting with a letter or digit",
        ],
    ),
    (
        "bad-path-scopes.yaml",
        &[
            "3:15: capabilities[0]: \"/srv/../etc\" is not an absolute path without \".\" or \"..\" components (or one under \"{state}/\")",
            "3:30: capabilities[0]: \"{state}/../other\" is not an absolute path without \".\" or \"..\" components (or one under \"{state}/\")",
            "3:50: capabilities[0]: \"{state}x\" is not an absolute path without \".\" or \"..\" components (or one under \"{state}/\")",
            "3:62: capabilities[0]: \"/srv/{state}\" is not an absolute path without \".\" or \"..\" components (or one under \"{state}/\")",
            "3:78: capabilities[0]: \"/srv/./docs\" is not an absolute path without \".\" or \"..\" components (or one under \"{state}/\")",
            "3:93: capabilities[0]: \"/srv/docs/..\" is not an absolute path without \".\" or \"..\" components (or one under \"{state}/\")",
            "5:19: capabilities[2]: \"example.com:0\" is not HOST:PORT (HOST a name, *.NAME, address, ADDR/LEN prefix or \"*\"; PORT 1-65535 or \"*\")",
            "5:36: capabilities[2]: \"example.com:65536\" is not HOST:PORT (HOST a name, *.NAME, address, ADDR/LEN prefix or \"*\"; PORT 1-65535 or \"*\")",
            "5:57: capabilities[2]: \":443\" is not HOST:PORT (HOST a name, *.NAME, address, ADDR/LEN prefix or \"*\"; PORT 1-65535 or \"*\")",
            "5:65: capabilities[2]: \"exa mple.com:443\" is not HOST:PORT (HOST a name, *.NAME, address, ADDR/LEN prefix or \"*\"; PORT 1-65535 or \"*\")",
            "5:85: capabilities[2]: \"host:\" is not HOST:PORT (HOST a name, *.NAME, address, ADDR/LEN prefix or \"*\"; PORT 1-65535 or \"*\")",
            "6:16: capabilities[3]: an empty scope grants nothing; remove \"tool.call\" or write a bare name for its default scope",
            "7:16: capabilities[4]: \"a/b:443\" is not HOST:PORT (HOST a name, *.NAME, address, ADDR/LEN prefix or \"*\"; PORT 1-65535 or \"*\")",
            "7:27: capabilities[4]: \"10.0.0.0/33:443\" is not HOST:PORT (HOST a name, *.NAME, address, ADDR/LEN prefix or \"*\"; PORT 1-65535 or \"*\")",
            "7:46: capabilities[4]: \"10.0.0.0/:443\" is not HOST:PORT (HOST a name, *.NAME, address, ADDR/LEN prefix or \"*\"; PORT 1-65535 or \"*\")",
            "7:63: capabilities[4]: \"10.0.0.0/8/8:443\" is not HOST:PORT (HOST a name, *.NAME, address, ADDR/LEN prefix or \"*\"; PORT 1-65535 or \"*\")",
            "7:83: capabilities[4]: \"[fd00::/129]:443\" is not HOST:PORT (HOST a name, *.NAME, address, ADDR/LEN prefix or \"*\"; PORT 1-65535 or \"*\")",
            "8:16: capabilities[5]: empty or invalid scope entry",
            "9:5: capabilities[6]: a capability with a scope is a one-key mapping such as \"fs.read: [/srv/docs]\"",
        ],
    ),
    (
        "bad-scopes.yaml",
        &[
            "3:15: capabilities[0]: \"relative/path\" is not an absolute path without \".\" or \"..\" components (or one under \"{state}/\")",
            "4:19: capabilities[1]: \"example.com\" is not HOST:PORT (HOST a name, *.NAME, address, ADDR/LEN prefix or \"*\"; PORT 1-65535 or \"*\")",
            "5:5: capabilities[2]: unknown capability \"fs.mount\": the \"fs.\" namespace is enforced by the kernel and has only fs.read, fs.write, fs.exec",
        ],
    ),
    (
        "bad-udp.yaml",
        &[
            "4:19: capabilities[0]: \"udp://*:443\": udp:// declares UDP only to a name, an address or a prefix (\"udp://api.example.com:443\", \"udp://192.0.2.1:443\"); \"*:PORT\" allows TCP and UDP already",
            "4:34: capabilities[0]: \"udp://api.example.com:0\" is not HOST:PORT (HOST a name, *.NAME, address, ADDR/LEN prefix or \"*\"; PORT 1-65535 or \"*\")",
            "5:16: capabilities[1]: \"udp://localhost:53\": udp:// is for net.connect only (net.bind grants local addresses for TCP and UDP)",
        ],
    ),
    (
        "bad-units.yaml",
        &[
            "3:8: compute.cpu: cpu \"1.2.3\" is not a CPU quantity (write \"1\", \"0.5\" or \"500m\")",
            "4:8: compute.mem: memory \"2 gigs\" is not a size (write \"2GiB\", \"512MiB\" or a number of bytes)",
            "5:9: compute.pids: must be positive, found 0",
        ],
    ),
    (
        "bad-wildcards.yaml",
        &[
            "3:40: capabilities[0]: \"*.com\": a wildcard needs a suffix of at least two labels (\"*.example.com\", not \"*.com\")",
            "3:53: capabilities[0]: \"a.*.example.com\": a wildcard is \"*.\" followed by a name (\"*.example.com\"); \"*\" stands for whole labels at the start only",
            "3:76: capabilities[0]: \"*example.com\": a wildcard is \"*.\" followed by a name (\"*.example.com\"); \"*\" stands for whole labels at the start only",
            "4:19: capabilities[0]: \"*.*.example.com\": only one \"*\", as the first label",
            "4:42: capabilities[0]: \"*.exa_mple.com\": the suffix after \"*.\" is not a DNS name (labels of 1-63 letters, digits and '-', 253 bytes in all)",
            "4:64: capabilities[0]: \"*.-x.example.com\": the suffix after \"*.\" is not a DNS name (labels of 1-63 letters, digits and '-', 253 bytes in all)",
        ],
    ),
    (
        "deny-granted.yaml",
        &["2:16: capability \"fs.write\" is granted in capabilities and denied in security.deny"],
    ),
    (
        "duplicate-key.yaml",
        &["2:1: invalid YAML: duplicate key \"name\": each field may appear once"],
    ),
    (
        "exec-relative.yaml",
        &[
            "3:12: exec.command: \"sh\" is not an absolute path (write e.g. \"/bin/sh\"; the daemon does not search PATH)",
            "4:10: exec.env: \"1BAD\" is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*)",
        ],
    ),
    (
        "hrt-without-deadline.yaml",
        &[
            "2:16: class.latency: HRT contracts need a deadline: add class.slo.deadline_ms (or must.deadline_ms)",
        ],
    ),
    (
        "huge-numbers.yaml",
        &[
            "3:9: compute.pids: number is too large (at most 4194304)",
            "4:8: compute.mem: memory \"99999999999999999999999TiB\" is too large (at most 64TiB)",
            "5:44: class.slo.deadline_ms: number is too large",
        ],
    ),
    (
        "latency-conflict.yaml",
        &[
            "2:1: both \"latency_class\" and \"class.latency\" are given with different values; \"latency_class\" is shorthand for \"class.latency\": keep one",
        ],
    ),
    (
        "latency-typo.yaml",
        &[
            "2:19: class.latency: unknown value \"srt\" (did you mean \"SRT\"?)",
            "3:10: restart: unknown value \"sometimes\"; expected one of \"no\", \"on-failure\", \"always\"",
        ],
    ),
    (
        "missing-name.yaml",
        &["1:1: missing field \"name\" (or \"agent\"): every contract names its agent"],
    ),
    (
        "name-conflict.yaml",
        &[
            "2:1: both \"name\" and \"agent\" are given with different values; \"agent\" is another spelling of \"name\": keep one",
        ],
    ),
    (
        "not-a-mapping.yaml",
        &["1:1: the contract: expected a mapping, found a list"],
    ),
    (
        "onset-over-turn.yaml",
        &[
            "2:41: class.slo.onset_ms (1500) exceeds class.slo.turn_ms (1000); the first token cannot come after the full turn",
        ],
    ),
    (
        "period-below-deadline.yaml",
        &[
            "7:16: class.slo.period_ms (5) is shorter than the deadline (10 ms); SCHED_DEADLINE needs runtime <= deadline <= period",
        ],
    ),
    (
        "runtime-over-deadline.yaml",
        &[
            "4:22: class.slo.runtime_ms (20) exceeds the deadline (10 ms); SCHED_DEADLINE needs runtime <= deadline <= period",
        ],
    ),
    (
        "tabs.yaml",
        &["3:2: invalid YAML: tabs disallowed within this context (block indentation)"],
    ),
    (
        "truncated.yaml",
        &["2:29: invalid YAML: unclosed bracket '{'"],
    ),
    (
        "unknown-capability.yaml",
        &["3:29: capabilities[1]: unknown capability \"fs.reed\" (did you mean \"fs.read\"?)"],
    ),
    (
        "unknown-field.yaml",
        &[
            "3:1: unknown field \"modelPolicyy\" in the contract (did you mean \"modelPolicy\"?)",
            "6:3: unknown field \"memory\" in compute (did you mean \"mem\"?)",
        ],
    ),
    (
        "wrong-types.yaml",
        &[
            "2:15: capabilities: expected a list of capability names, or a mapping NAME: SCOPE, found an integer",
            "3:10: compute: expected a mapping, found a string",
            "4:19: restart.limit: expected a whole number, found a string",
        ],
    ),
    (
        "zero-cpu.yaml",
        &[
            "2:17: compute.cpu: must be positive",
            "2:27: compute.mem: must be positive",
        ],
    ),
];

#[test]
fn invalid_examples_report_exact_positions() {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/invalid");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .expect("tests/invalid exists")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml"))
        .collect();
    files.sort();
    let listed: Vec<&str> = EXPECTED.iter().map(|(f, _)| *f).collect();
    assert_eq!(
        files, listed,
        "every file in tests/invalid/ needs an entry in EXPECTED"
    );
    for (file, want) in EXPECTED {
        let text = std::fs::read_to_string(dir.join(file)).expect("readable");
        let err = match contracts::parse_contract(&text, file) {
            Ok(_) => panic!("{file} should not validate"),
            Err(e) => e,
        };
        let got: Vec<String> = err
            .diagnostics
            .iter()
            .map(|d| {
                assert_eq!(d.file, *file);
                d.to_string()
                    .trim_start_matches(&format!("{file}:"))
                    .to_string()
            })
            .collect();
        assert_eq!(got, *want, "{file}");
        // Display is FILE:LINE:COL: message, one per line
        assert_eq!(err.to_string().lines().count(), want.len());
    }
}
