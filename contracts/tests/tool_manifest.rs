//! Tool manifests: every example parses; mistakes are reported as FILE:LINE:COL with the fix.

use std::path::PathBuf;
use std::time::Duration;

use contracts::tool::{Risk, ToolKind, parse_tool};

fn examples_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/tools")
}

#[test]
fn every_example_tool_parses() {
    let mut names = Vec::new();
    let mut entries: Vec<_> = std::fs::read_dir(examples_dir())
        .expect("examples/tools exists")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    entries.sort();
    for p in entries {
        match contracts::tool::load_tool(&p) {
            Ok(m) => names.push(m.name),
            Err(e) => panic!("{} does not parse:\n{e}", p.display()),
        }
    }
    names.sort();
    assert_eq!(
        names,
        ["clock.now", "crypto.hmac", "files", "text.wordcount"]
    );
}

#[test]
fn exec_manifest_fields() {
    let m = contracts::tool::load_tool(&examples_dir().join("text-wordcount.yaml")).unwrap();
    assert_eq!(m.risk, Risk::Low);
    assert_eq!(m.timeout, Duration::from_secs(5));
    assert_eq!(m.limits.mem_bytes, Some(128 << 20));
    assert_eq!(m.limits.pids, Some(8));
    let ToolKind::Exec(p) = &m.kind else {
        panic!("exec expected")
    };
    assert_eq!(p.command, PathBuf::from("/usr/bin/python3"));
    assert_eq!(m.input_schema.as_ref().unwrap()["required"][0], "text");
    assert!(m.output_schema.is_some());
    // The schema's position is kept for errors found when the daemon compiles it.
    assert!(
        m.schema_position(false)
            .ends_with("text-wordcount.yaml:15:3"),
        "{}",
        m.schema_position(false)
    );
}

#[test]
fn mcp_manifest_fields() {
    let m = contracts::tool::load_tool(&examples_dir().join("files.yaml")).unwrap();
    let ToolKind::Mcp {
        program,
        tools,
        startup_timeout,
    } = &m.kind
    else {
        panic!("mcp expected")
    };
    assert!(program.args.contains(&"{fs.read}".to_string()));
    assert!(tools.is_none());
    assert_eq!(*startup_timeout, Duration::from_secs(60));
    assert_eq!(m.needs.fs_read, ["/"]);
    assert!(m.input_schema.is_none());
}

/// The first error line of `text` parsed as `t.yaml`.
fn err(text: &str) -> String {
    match parse_tool(text, "t.yaml") {
        Ok(_) => panic!("expected an error for:\n{text}"),
        Err(e) => e.to_string(),
    }
}

const GOOD_HEAD: &str = "name: demo.tool\ndescription: A demo\n";

#[test]
fn unknown_fields_have_positions_and_suggestions() {
    let e = err(&format!(
        "{GOOD_HEAD}timout_ms: 100\nexec: {{command: /bin/true}}\ninput_schema: {{type: object}}\n"
    ));
    assert_eq!(
        e,
        "t.yaml:3:1: unknown field \"timout_ms\" in the tool manifest (did you mean \"timeout_ms\"?)"
    );
    let e = err(&format!(
        "{GOOD_HEAD}exec: {{command: /bin/true}}\ninputSchema: {{type: object}}\n"
    ));
    assert!(
        e.contains("t.yaml:4:1: unknown field \"inputSchema\""),
        "{e}"
    );
    assert!(e.contains("did you mean \"input_schema\"?"), "{e}");
    let e = err(&format!(
        "{GOOD_HEAD}exec:\n  comand: /bin/true\ninput_schema: {{type: object}}\n"
    ));
    assert!(
        e.contains("t.yaml:4:3: unknown field \"comand\" in exec (did you mean \"command\"?)"),
        "{e}"
    );
    let e = err(&format!(
        "{GOOD_HEAD}exec: {{command: /bin/true}}\ninput_schema: {{type: object}}\nsandbox:\n  fs.reed: [/srv]\n"
    ));
    assert!(
        e.contains("t.yaml:6:3: unknown field \"fs.reed\" in sandbox (did you mean \"fs.read\"?)"),
        "{e}"
    );
}

#[test]
fn values_are_checked() {
    let base = format!("{GOOD_HEAD}input_schema: {{type: object}}\n");
    let e = err(&format!("{base}exec: {{command: python3}}\n"));
    assert!(
        e.contains("t.yaml:4:17: exec.command: \"python3\" is not an absolute path"),
        "{e}"
    );
    let e = err(&format!("{base}risk: hihg\nexec: {{command: /bin/true}}\n"));
    assert!(
        e.contains("t.yaml:4:7: risk: unknown value \"hihg\" (did you mean \"high\"?)"),
        "{e}"
    );
    let e = err(&format!(
        "{base}exec: {{command: /bin/x, args: [\"--dir={{fs.read}}\"]}}\n"
    ));
    assert!(e.contains("must be the whole argument"), "{e}");
    let e = err(&format!(
        "{base}exec: {{command: /bin/x, args: [\"{{fs.reed}}\"]}}\n"
    ));
    assert!(
        e.contains("unknown placeholder {fs.reed} (did you mean {fs.read}?)"),
        "{e}"
    );
    let e = err(&format!(
        "{base}exec: {{command: /bin/true}}\nsandbox: {{fs.read: [srv]}}\n"
    ));
    assert!(
        e.contains("t.yaml:5:21: sandbox.fs.read: \"srv\" is not an absolute path"),
        "{e}"
    );
    let e = err(&format!(
        "{base}exec: {{command: /bin/true}}\nsandbox: {{net.connect: [example.com]}}\n"
    ));
    assert!(e.contains("is not HOST:PORT"), "{e}");
    let e = err(&format!(
        "{base}exec: {{command: /bin/true}}\nlimits: {{mem: 12Mib}}\n"
    ));
    assert!(e.contains("limits.mem"), "{e}");
    let e = err(&format!(
        "{base}exec: {{command: /bin/true}}\nsecrets: [\"/a~2\"]\n"
    ));
    assert!(e.contains("secrets[0]"), "{e}");
}

#[test]
fn names_are_capabilities() {
    let tail = "description: d\nexec: {command: /bin/true}\ninput_schema: {type: object}\n";
    let e = err(&format!("name: fs.read\n{tail}"));
    assert!(
        e.contains("t.yaml:1:7: name: \"fs.read\" is a kernel-enforced capability, not a tool"),
        "{e}"
    );
    let e = err(&format!("name: summarise\n{tail}"));
    assert!(e.contains("did you mean \"summarize\"?"), "{e}");
    let e = err(&format!("name: Files Tool\n{tail}"));
    assert!(e.contains("is not a capability name"), "{e}");
    assert!(parse_tool(&format!("name: summarize\n{tail}"), "t.yaml").is_ok());
}

#[test]
fn kinds_and_schemas() {
    let e = err(&format!("{GOOD_HEAD}input_schema: {{type: object}}\n"));
    assert!(e.contains("t.yaml:1:1: missing \"exec\" or \"mcp\""), "{e}");
    let e = err(&format!(
        "{GOOD_HEAD}exec: {{command: /bin/true}}\nmcp: {{command: /bin/true}}\ninput_schema: {{type: object}}\n"
    ));
    assert!(e.contains("t.yaml:4:1: a tool is either \"exec\""), "{e}");
    let e = err(&format!("{GOOD_HEAD}exec: {{command: /bin/true}}\n"));
    assert!(e.contains("missing field \"input_schema\""), "{e}");
    let e = err(&format!(
        "{GOOD_HEAD}exec: {{command: /bin/true}}\ninput_schema: {{type: string}}\n"
    ));
    assert!(
        e.contains("t.yaml:4:15: input_schema: the top-level \"type\" must be \"object\""),
        "{e}"
    );
    let e = err(&format!(
        "{GOOD_HEAD}mcp: {{command: /usr/bin/node}}\ninput_schema: {{type: object}}\n"
    ));
    assert!(
        e.contains("input_schema: not allowed for an mcp tool"),
        "{e}"
    );
    let e = err("description: d\nexec: {command: /bin/true}\ninput_schema: {type: object}\n");
    assert!(e.contains("t.yaml:1:1: missing field \"name\""), "{e}");
    // Every problem is reported at once, in file order.
    let e = err("name: X\ndescription: d\nrisk: none\ntimeout_ms: -1\nexec: {command: rel}\n");
    let lines: Vec<&str> = e.lines().collect();
    assert!(lines.len() >= 4, "{e}");
    assert!(
        lines[0].starts_with("t.yaml:1:7:") && lines[1].starts_with("t.yaml:3:"),
        "{e}"
    );
    assert!(err("").contains("t.yaml:1:1: the tool manifest is empty"));
    assert!(err("name: [").starts_with("t.yaml:"));
}
