//! Tools (issue 8): manifests load with positioned errors, arguments are checked before anything
//! runs, exec tools run sandboxed as the caller in their own cgroup (intersected scope, timeout,
//! output checks), secrets are redacted with hashes kept, and an MCP stdio server is proxied,
//! sandboxed, restarted after it dies and stopped on forget.
//!
//! Tests that start processes need root and cgroup2; they print SKIPPED and return otherwise.
#![allow(clippy::unwrap_used)] // the test bed's helpers panic with the failing call

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use agentosd::cgroup::Cgroup;
use agentosd::sandbox::Grants;
use agentosd::tools::{Caller, RunnerConfig, ToolError, Tools};
use serde_json::{Value, json};

static UID: AtomicU32 = AtomicU32::new(0);

fn examples() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/tools")
}

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A private world for one test: directories, a caller, a cgroup root.
struct Bed {
    dir: tempfile::TempDir,
    cfg: RunnerConfig,
    _cg: Option<common::TestCgroup>,
    caller: Caller,
}

impl Bed {
    fn new(tag: &str, with_cgroup: bool) -> Bed {
        let dir = tempfile::tempdir().unwrap();
        chmod(dir.path(), 0o711);
        let root = dir.path().canonicalize().unwrap();
        for (d, mode) in [
            ("state", 0o711),
            ("granted/sub", 0o755),
            ("outside", 0o755),
            ("bin", 0o755),
            ("home", 0o700),
        ] {
            std::fs::create_dir_all(root.join(d)).unwrap();
            chmod(&root.join(d), mode);
        }
        chmod(&root.join("granted"), 0o755);
        for (f, text) in [
            ("granted/data", "granted data\n"),
            ("granted/sub/x", "sub data\n"),
            ("outside/secret", "outside data\n"),
        ] {
            std::fs::write(root.join(f), text).unwrap();
            chmod(&root.join(f), 0o644);
        }
        let uid = 64000 + (std::process::id() % 500) * 2 + UID.fetch_add(1, Ordering::SeqCst) % 2;
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            std::os::unix::fs::chown(root.join("home"), Some(uid), Some(uid)).unwrap();
        }
        let cg = with_cgroup.then(|| common::TestCgroup::new(tag));
        let cgroup_root = Cgroup::new(
            cg.as_ref()
                .map_or(root.join("no-cgroup"), |c| c.path.clone()),
        );
        if with_cgroup {
            // The caller's agent cgroup, as the supervisor makes it: tools run in its subtree
            // and only while it exists.
            agentosd::cgroup::agent_cgroup(&cgroup_root, "t", tag)
                .create()
                .unwrap();
        }
        let caller = Caller {
            agent: format!("t/{tag}"),
            tenant: "t".into(),
            name: tag.into(),
            uid,
            gid: uid,
            home: root.join("home"),
            grants: Grants {
                fs_read: vec![root.join("granted")],
                ..Default::default()
            },
            tool_scopes: [
                "probe",
                "narrow",
                "marker",
                "sleeper",
                "liar",
                "fails",
                "big",
                "fx",
                "text.wordcount",
                "clock.now",
                "crypto.hmac",
                "files",
                "slow.a",
                "slow.b",
            ]
            .iter()
            .map(|c| (c.to_string(), vec!["*".to_string()]))
            .collect(),
        };
        Bed {
            cfg: RunnerConfig {
                cgroup_root,
                state_dir: root.join("state"),
                hooks: None,
            },
            dir,
            _cg: cg,
            caller,
        }
    }

    fn root(&self) -> PathBuf {
        self.dir.path().canonicalize().unwrap()
    }

    /// Write an executable helper into `bin/`.
    fn program(&self, name: &str, text: &str) -> PathBuf {
        let p = self.root().join("bin").join(name);
        std::fs::write(&p, text).unwrap();
        chmod(&p, 0o755);
        p
    }

    /// Load manifests given as (file name, YAML with `@ROOT@` for the bed's root).
    fn tools(&self, manifests: &[(&str, &str)]) -> Arc<Tools> {
        let d = self.root().join("tools.d");
        std::fs::create_dir_all(&d).unwrap();
        for (f, text) in manifests {
            std::fs::write(
                d.join(f),
                text.replace("@ROOT@", &self.root().display().to_string()),
            )
            .unwrap();
        }
        let (tools, errors) = Tools::load(&d, self.cfg.clone());
        assert!(errors.is_empty(), "manifests do not load: {errors:#?}");
        tools
    }

    /// The tool cgroups in the caller's subtree (`agents/t/<tag>/tools/*`).
    fn tool_cgroups(&self) -> Vec<String> {
        let p = agentosd::cgroup::agent_cgroup(&self.cfg.cgroup_root, "t", &self.caller.name)
            .path()
            .join("tools");
        let mut v: Vec<String> = std::fs::read_dir(&p)
            .map(|rd| {
                rd.flatten()
                    .filter(|e| e.path().is_dir())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }
}

fn never() -> tokio::sync::oneshot::Receiver<()> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::mem::forget(tx);
    rx
}

fn structured(v: &Value) -> &Value {
    v.get("structuredContent")
        .unwrap_or_else(|| panic!("no structuredContent in {v}"))
}

const MARKER: &str = r#"
name: marker
description: Touch a marker file in the caller's state directory.
exec:
  command: /bin/sh
  args: [-c, "touch {state}/marker && echo '{}'"]
input_schema:
  type: object
  properties: {n: {type: integer}, token: {type: string}}
  required: [n]
  additionalProperties: false
sandbox:
  fs.write: ["{state}"]
"#;

#[tokio::test]
async fn example_manifests_load() {
    let bed = Bed::new("examples", false);
    let (tools, errors) = Tools::load(&examples(), bed.cfg.clone());
    assert!(errors.is_empty(), "{errors:#?}");
    let names: Vec<&str> = tools.manifests().map(|m| m.name.as_str()).collect();
    assert_eq!(
        names,
        ["clock.now", "crypto.hmac", "files", "text.wordcount"]
    );
    assert_eq!(
        tools.capability_of("files.read_text_file").as_deref(),
        Some("files")
    );
    assert_eq!(
        tools.capability_of("text.wordcount").as_deref(),
        Some("text.wordcount")
    );
    assert_eq!(
        tools.capability_of("files"),
        None,
        "an mcp manifest is not itself a tool"
    );
    assert_eq!(tools.capability_of("nope"), None);
}

#[tokio::test]
async fn load_reports_broken_files_and_keeps_the_rest() {
    let bed = Bed::new("broken", false);
    let d = bed.root().join("tools.d");
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("good.yaml"), MARKER).unwrap();
    std::fs::write(
        d.join("typo.yaml"),
        "name: typo\ndescription: d\nexec: {command: /bin/true}\ninput_schema: {type: object}\ntimout_ms: 5\n",
    )
    .unwrap();
    std::fs::write(
        d.join("schema.yaml"),
        "name: schema\ndescription: d\nexec: {command: /bin/true}\ninput_schema:\n  type: object\n  properties: {a: {type: 12}}\n",
    )
    .unwrap();
    std::fs::write(d.join("dup.yml"), MARKER).unwrap();
    std::fs::write(d.join("README"), "not a manifest").unwrap();
    let (tools, errors) = Tools::load(&d, bed.cfg.clone());
    let d = d.display();
    assert_eq!(errors.len(), 3, "{errors:#?}");
    assert!(errors.iter().any(|e| e.starts_with(&format!("{d}/typo.yaml:5:1: unknown field \"timout_ms\" in the tool manifest (did you mean \"timeout_ms\"?)"))), "{errors:#?}");
    assert!(
        errors.iter().any(|e| e.starts_with(&format!(
            "{d}/schema.yaml:5:3: input_schema: invalid JSON Schema"
        ))),
        "{errors:#?}"
    );
    assert!(
        errors
            .iter()
            .any(|e| e.contains("tool \"marker\" is already defined in")
                && e.starts_with(&format!("{d}/good.yaml"))),
        "{errors:#?}"
    );
    assert_eq!(tools.manifests().count(), 1);
}

#[tokio::test]
async fn invalid_arguments_are_refused_before_anything_runs() {
    let bed = Bed::new("args", common::skip_reason().is_none());
    let tools = bed.tools(&[("marker.yaml", MARKER)]);
    let marker = bed.caller.home.join("marker");
    for bad in [
        json!({"n": "one"}),
        json!({}),
        json!({"n": 1, "extra": true}),
        json!([1]),
    ] {
        match tools
            .call(&bed.caller, "marker", bad.clone(), never())
            .await
        {
            Err(ToolError::InvalidArguments { tool, errors }) => {
                assert_eq!(tool, "marker");
                assert!(!errors.is_empty());
            }
            other => panic!("{bad}: expected InvalidArguments, got {other:?}"),
        }
    }
    // The message points at the field and never echoes the value (it could be a secret).
    let Err(e) = tools
        .call(
            &bed.caller,
            "marker",
            json!({"n": "hunter2", "token": 5}),
            never(),
        )
        .await
    else {
        panic!("accepted")
    };
    let text = e.to_string();
    assert!(
        text.contains("at /n:") && text.contains("at /token:"),
        "{text}"
    );
    assert!(!text.contains("hunter2"), "{text}");
    assert!(
        !marker.exists(),
        "the tool ran although its arguments were refused"
    );
    assert!(
        bed.tool_cgroups().is_empty(),
        "a cgroup was made: {:?}",
        bed.tool_cgroups()
    );
    // Unknown tools and ungranted capabilities are refused too, before anything runs.
    assert!(matches!(
        tools
            .call(&bed.caller, "markers", json!({"n": 1}), never())
            .await,
        Err(ToolError::UnknownTool(_))
    ));
    let mut stranger = bed.caller.clone();
    stranger.tool_scopes.clear();
    assert!(matches!(
        tools
            .call(&stranger, "marker", json!({"n": 1}), never())
            .await,
        Err(ToolError::NotGranted { .. })
    ));
    assert!(tools.list(&stranger).await.is_empty());
    assert!(!marker.exists());

    skip_unless_capable!();
    let r = tools
        .call(&bed.caller, "marker", json!({"n": 1}), never())
        .await
        .unwrap();
    assert_eq!(r["isError"], Value::Null, "{r}");
    assert!(
        marker.exists(),
        "the valid call did not run (so the check above proved nothing)"
    );
}

const PROBE_PY: &str = r#"#!/usr/bin/python3
import json, os, sys
args = json.load(sys.stdin)
def attempt(p):
    try:
        with open(p) as f:
            return f.read().strip()
    except OSError as e:
        return "errno %d" % e.errno
status = open("/proc/self/status").read()
field = lambda k: [l.split(":", 1)[1].strip() for l in status.splitlines() if l.startswith(k + ":")][0]
json.dump({
    "uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(),
    "cgroup": [l for l in open("/proc/self/cgroup").read().splitlines() if l.startswith("0::")][0],
    "reads": {p: attempt(p) for p in args["paths"]},
    "fds": sorted(int(x) for x in os.listdir("/proc/self/fd")),
    "cap_eff": field("CapEff"), "cap_bnd": field("CapBnd"), "no_new_privs": field("NoNewPrivs"),
    "seccomp": field("Seccomp"),
    "cwd": os.getcwd(), "env_scope": os.environ.get("AGENTOS_SCOPE"),
}, sys.stdout)
"#;

fn probe_manifest(name: &str, fs_read: &str) -> String {
    format!(
        r#"
name: {name}
description: Report what the sandbox allows.
exec:
  command: /usr/bin/python3
  args: ["@ROOT@/bin/probe.py"]
input_schema:
  type: object
  properties: {{paths: {{type: array, items: {{type: string}}}}}}
  required: [paths]
sandbox:
  runtime: ["@ROOT@/bin/probe.py"]
  fs.read: [{fs_read}]
"#
    )
}

#[tokio::test]
async fn exec_tool_runs_sandboxed_as_the_caller_in_its_own_cgroup() {
    skip_unless_capable!();
    let bed = Bed::new("exec", true);
    bed.program("probe.py", PROBE_PY);
    let root = bed.root();
    let tools = bed.tools(&[
        ("probe.yaml", &probe_manifest("probe", "/")),
        (
            "narrow.yaml",
            &probe_manifest("narrow", "\"@ROOT@/granted/sub\""),
        ),
    ]);
    let paths = [
        root.join("granted/data"),
        root.join("granted/sub/x"),
        root.join("outside/secret"),
        PathBuf::from("/etc/shadow"),
    ];
    let paths: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    let r = tools
        .call(&bed.caller, "probe", json!({"paths": paths}), never())
        .await
        .unwrap();
    let s = structured(&r);
    assert_eq!(s["uid"], bed.caller.uid, "{s}");
    assert_eq!(s["gid"], bed.caller.gid, "{s}");
    assert_eq!(s["groups"], json!([]), "{s}");
    let cg = s["cgroup"].as_str().unwrap();
    let cg_rel = bed
        .cfg
        .cgroup_root
        .path()
        .strip_prefix(agentosd::cgroup::cgroup2_mount().unwrap())
        .unwrap();
    assert!(
        cg.starts_with(&format!(
            "0::/{}/agents/t/{}/tools/call-",
            cg_rel.display(),
            bed.caller.name
        )) && cg.ends_with("-probe"),
        "{cg}"
    );
    // The caller may read granted/, the tool may read "/": it reads granted/ only.
    assert_eq!(s["reads"][&paths[0]], "granted data", "{s}");
    assert_eq!(s["reads"][&paths[1]], "sub data", "{s}");
    assert_eq!(
        s["reads"][&paths[2]], "errno 13",
        "outside the intersection: EACCES from Landlock: {s}"
    );
    assert_eq!(s["reads"][&paths[3]], "errno 13", "{s}");
    assert_eq!(
        s["fds"],
        json!([0, 1, 2, 3]),
        "only stdio (and listdir's own fd): {s}"
    );
    assert_eq!(s["cap_eff"], "0000000000000000", "{s}");
    assert_eq!(s["cap_bnd"], "0000000000000000", "{s}");
    assert_eq!(s["no_new_privs"], "1", "{s}");
    assert_eq!(s["seccomp"], "2", "{s}");
    assert_eq!(s["env_scope"], "[\"*\"]", "{s}");
    let scratch = s["cwd"].as_str().unwrap();
    assert!(
        scratch.starts_with(
            &bed.cfg
                .state_dir
                .join("tools/scratch/call-")
                .display()
                .to_string()
        ),
        "{scratch}"
    );
    // Nothing of the call outlives it.
    assert!(
        !Path::new(scratch).exists(),
        "scratch directory left behind"
    );
    assert!(
        bed.tool_cgroups().is_empty(),
        "cgroups left behind: {:?}",
        bed.tool_cgroups()
    );

    // The other side of the intersection: the manifest bounds the tool to granted/sub.
    let r = tools
        .call(&bed.caller, "narrow", json!({"paths": paths}), never())
        .await
        .unwrap();
    let s = structured(&r);
    assert_eq!(s["reads"][&paths[0]], "errno 13", "{s}");
    assert_eq!(s["reads"][&paths[1]], "sub data", "{s}");
}

#[tokio::test]
async fn exec_timeout_cancel_failures_and_output_checks() {
    skip_unless_capable!();
    let bed = Bed::new("limits", true);
    let tools = bed.tools(&[
        (
            "sleeper.yaml",
            r#"
name: sleeper
description: Leave a child behind and sleep.
timeout_ms: 500
exec:
  command: /bin/sh
  args: [-c, "sleep 60 & echo $! > {state}/bg.pid; sleep 60"]
input_schema: {type: object}
sandbox: {fs.write: ["{state}"]}
"#,
        ),
        (
            "liar.yaml",
            r#"
name: liar
description: Break its own output schema.
exec:
  command: /bin/sh
  args: [-c, "echo '{\"count\": \"many\"}'"]
input_schema: {type: object}
output_schema:
  type: object
  properties: {count: {type: integer}}
  required: [count]
"#,
        ),
        (
            "fails.yaml",
            r#"
name: fails
description: Fail loudly.
exec:
  command: /bin/sh
  args: [-c, "echo partial; echo 'no such thing' >&2; exit 3"]
input_schema: {type: object}
"#,
        ),
        (
            "big.yaml",
            r#"
name: big
description: Print too much.
exec:
  command: /bin/sh
  args: [-c, "head -c 100000 /dev/zero | tr '\\0' a"]
input_schema: {type: object}
limits: {output: 1KiB}
"#,
        ),
    ]);

    let t0 = Instant::now();
    let r = tools.call(&bed.caller, "sleeper", json!({}), never()).await;
    assert!(matches!(r, Err(ToolError::Timeout { .. })), "{r:?}");
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "took {:?}",
        t0.elapsed()
    );
    let bg: u32 = std::fs::read_to_string(bed.caller.home.join("bg.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let gone = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| {
                s.rsplit(')')
                    .next()
                    .unwrap_or("")
                    .trim_start()
                    .starts_with('Z')
            })
            .unwrap_or(true)
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while !gone(bg) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        gone(bg),
        "the tool's background child {bg} survived the timeout"
    );
    assert!(bed.tool_cgroups().is_empty(), "{:?}", bed.tool_cgroups());

    let (tx, rx) = tokio::sync::oneshot::channel();
    let t0 = Instant::now();
    let call = tools.call(&bed.caller, "sleeper", json!({}), rx);
    let cancel = async {
        tokio::time::sleep(Duration::from_millis(150)).await;
        tx.send(()).unwrap();
    };
    let (r, ()) = tokio::join!(call, cancel);
    assert!(matches!(r, Err(ToolError::Cancelled(_))), "{r:?}");
    assert!(
        t0.elapsed() < Duration::from_millis(450),
        "cancel waited for the timeout"
    );

    let r = tools.call(&bed.caller, "liar", json!({}), never()).await;
    match r {
        Err(ToolError::InvalidOutput { errors, .. }) => {
            assert!(errors[0].starts_with("at /count:"), "{errors:?}")
        }
        other => panic!("expected InvalidOutput, got {other:?}"),
    }

    let r = tools
        .call(&bed.caller, "fails", json!({}), never())
        .await
        .unwrap();
    assert_eq!(r["isError"], true, "{r}");
    let text = r["content"][0]["text"].as_str().unwrap();
    assert!(
        text.contains("status=3") && text.contains("no such thing"),
        "{text}"
    );

    let r = tools.call(&bed.caller, "big", json!({}), never()).await;
    assert!(
        matches!(&r, Err(ToolError::Failed(m)) if m.contains("limits.output (1024 bytes)")),
        "{r:?}"
    );
    assert!(bed.tool_cgroups().is_empty(), "{:?}", bed.tool_cgroups());
}

#[tokio::test]
async fn example_exec_tools_work() {
    skip_unless_capable!();
    let bed = Bed::new("ex", true);
    // The examples name /usr/lib/agentos/tools/*.py; point them at the repo's copies.
    let ex = examples().canonicalize().unwrap();
    for f in ["wordcount.py", "hmac_sign.py"] {
        std::fs::copy(ex.join(f), bed.root().join("bin").join(f)).unwrap();
    }
    // The examples run as shipped: their limits are `must: false`, so on a host whose
    // pids/memory controllers are not on cgroup2 (hybrid hierarchy) they run without them.
    let controllers =
        std::fs::read_to_string(bed.cfg.cgroup_root.path().join("cgroup.controllers"))
            .unwrap_or_default();
    let limits_ok = ["pids", "memory"]
        .iter()
        .all(|c| controllers.split_whitespace().any(|x| x == *c));
    let read = |f: &str| {
        std::fs::read_to_string(ex.join(f)).unwrap().replace(
            "/usr/lib/agentos/tools",
            &bed.root().join("bin").display().to_string(),
        )
    };
    let tools = bed.tools(&[
        ("text-wordcount.yaml", &read("text-wordcount.yaml")),
        ("clock-now.yaml", &read("clock-now.yaml")),
        ("crypto-hmac.yaml", &read("crypto-hmac.yaml")),
    ]);
    let r = tools
        .call(
            &bed.caller,
            "text.wordcount",
            json!({"text": "the cat and the hat\nthe end", "top": 1}),
            never(),
        )
        .await
        .unwrap();
    assert_eq!(
        structured(&r),
        &json!({"lines": 2, "words": 7, "characters": 27, "top": [{"word": "the", "count": 3}]})
    );
    let r = tools
        .call(&bed.caller, "clock.now", json!({}), never())
        .await
        .unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(
        structured(&r)["unix"].as_u64().unwrap().abs_diff(now) < 60,
        "{r}"
    );
    let args = json!({"message": "hello", "key": "s3cret"});
    let r = tools
        .call(&bed.caller, "crypto.hmac", args.clone(), never())
        .await
        .unwrap();
    assert_eq!(
        structured(&r)["mac"],
        "e5a01537481fa0b2c697f787c7aff885412cf0760d08e08502259b39d2d6ae68"
    );
    let audit = tools.redact("crypto.hmac", &args);
    assert_eq!(audit["message"], "hello");
    assert!(!audit.to_string().contains("s3cret"));
    let list = tools.list(&bed.caller).await;
    let names: Vec<&str> = list.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["clock.now", "crypto.hmac", "text.wordcount"]);
    assert_eq!(list[2].to_mcp()["inputSchema"]["required"], json!(["text"]));

    if !limits_ok {
        // Declared limits marked `must` that cannot be enforced refuse the call instead of
        // running weaker.
        let d = bed.root().join("strict.d");
        std::fs::create_dir_all(&d).unwrap();
        let strict_text = read("text-wordcount.yaml").replace("must: false", "must: true");
        assert!(strict_text.contains("must: true"));
        std::fs::write(d.join("wc.yaml"), strict_text).unwrap();
        let (strict, errors) = Tools::load(&d, bed.cfg.clone());
        assert!(errors.is_empty());
        let r = strict
            .call(&bed.caller, "text.wordcount", json!({"text": "a"}), never())
            .await;
        assert!(
            matches!(&r, Err(ToolError::Failed(m)) if m.contains("controller is not available") && m.contains("limits.must: true")),
            "{r:?}"
        );
        assert!(bed.tool_cgroups().is_empty(), "{:?}", bed.tool_cgroups());
    }
}

#[tokio::test]
async fn redaction_keeps_hashes() {
    let bed = Bed::new("redact", false);
    let (tools, errors) = Tools::load(&examples(), bed.cfg.clone());
    assert!(errors.is_empty(), "{errors:?}");
    let args = json!({"message": "m", "key": "k1", "headers": {"Authorization": "Bearer abc"}, "list": [{"api_key": "x"}]});
    let r = tools.redact("crypto.hmac", &args);
    let hash = |v: &Value| {
        let canon = contracts::canonical::to_canonical_json(v);
        format!(
            "sha256:{}",
            contracts::canonical::sha256_hex(canon.as_bytes())
        )
    };
    assert_eq!(r["key"], json!({"redacted": hash(&json!("k1"))}));
    assert_eq!(
        r["headers"]["Authorization"]["redacted"],
        hash(&json!("Bearer abc"))
    );
    assert_eq!(r["list"][0]["api_key"]["redacted"], hash(&json!("x")));
    assert_eq!(r["message"], "m");
    // Equal secrets, equal hashes: an auditor can correlate without reading.
    assert_eq!(
        tools.redact("crypto.hmac", &json!({"key": "k1"}))["key"],
        r["key"]
    );
    // `key` is a secret of crypto.hmac only; the defaults apply to every tool.
    let other = tools.redact("clock.now", &json!({"key": "k1", "password": "p"}));
    assert_eq!(other["key"], "k1");
    assert!(other["password"]["redacted"].is_string());
    // Results: structured content and the JSON text that echoes it.
    let result = json!({"content": [{"type": "text", "text": "{\"key\":\"k1\",\"mac\":\"ab\"}"}], "structuredContent": {"key": "k1", "mac": "ab"}});
    let r = tools.redact("crypto.hmac", &result);
    assert!(!r.to_string().contains("k1"), "{r}");
    assert_eq!(r["structuredContent"]["mac"], "ab");
}

const FIXTURE_PY: &str = r#"#!/usr/bin/python3
# A tiny MCP stdio server (stdlib only). It does NOT check paths against its directories:
# a "buggy" server, so that only the sandbox keeps it in.
import json, os, sys, threading, time
dirs = sys.argv[1:]
cancelled = []
lock = threading.Lock()
def send(m):
    with lock:
        sys.stdout.write(json.dumps(m) + "\n")
        sys.stdout.flush()
obj = lambda props={}, req=[]: {"type": "object", "properties": props, "required": req}
TOOLS = [
    {"name": "dirs", "description": "the allowed directories", "inputSchema": obj()},
    {"name": "read", "description": "read a file", "inputSchema": obj({"path": {"type": "string"}}, ["path"])},
    {"name": "whoami", "description": "uid and cgroup", "inputSchema": obj(),
     "outputSchema": obj({"uid": {"type": "integer"}, "cgroup": {"type": "string"}}, ["uid", "cgroup"])},
    {"name": "crash", "description": "exit at once", "inputSchema": obj()},
    {"name": "sleep", "description": "sleep", "inputSchema": obj({"seconds": {"type": "number"}}, ["seconds"])},
    {"name": "cancelled", "description": "request ids cancelled so far", "inputSchema": obj()},
    {"name": "hidden", "description": "not in the allow-list", "inputSchema": obj()},
]
def text(t, err=False, sc=None):
    r = {"content": [{"type": "text", "text": t}]}
    if err: r["isError"] = True
    if sc is not None: r["structuredContent"] = sc
    return r
def call(id, name, a):
    if name == "dirs": r = text(json.dumps(dirs), sc={"dirs": dirs})
    elif name == "read":
        try:
            with open(a["path"]) as f: r = text(f.read())
        except OSError as e: r = text("errno %d" % e.errno, True, {"errno": e.errno})
    elif name == "whoami":
        sc = {"uid": os.getuid(), "cgroup": [l for l in open("/proc/self/cgroup").read().splitlines() if l.startswith("0::")][0]}
        r = text(json.dumps(sc), sc=sc)
    elif name == "crash": os._exit(7)
    elif name == "sleep": time.sleep(a["seconds"]); r = text("slept")
    elif name == "cancelled": r = text(json.dumps(cancelled), sc={"ids": cancelled})
    else:
        send({"jsonrpc": "2.0", "id": id, "error": {"code": -32602, "message": "unknown tool " + name}}); return
    send({"jsonrpc": "2.0", "id": id, "result": r})
for line in sys.stdin:
    m = json.loads(line)
    meth, id = m.get("method"), m.get("id")
    if meth == "initialize":
        send({"jsonrpc": "2.0", "id": id, "result": {"protocolVersion": m["params"]["protocolVersion"],
              "capabilities": {"tools": {}}, "serverInfo": {"name": "fixture", "version": "1"}}})
    elif meth == "tools/list":
        # Two pages, to exercise the cursor.
        if (m.get("params") or {}).get("cursor") == "p2": send({"jsonrpc": "2.0", "id": id, "result": {"tools": TOOLS[4:]}})
        else: send({"jsonrpc": "2.0", "id": id, "result": {"tools": TOOLS[:4], "nextCursor": "p2"}})
    elif meth == "tools/call":
        threading.Thread(target=call, args=(id, m["params"]["name"], m["params"].get("arguments", {})), daemon=True).start()
    elif meth == "notifications/cancelled": cancelled.append(m["params"]["requestId"])
    elif id is not None: send({"jsonrpc": "2.0", "id": id, "error": {"code": -32601, "message": "no " + meth}})
"#;

const FX: &str = r#"
name: fx
description: The MCP fixture server.
risk: low
timeout_ms: 800
mcp:
  command: /usr/bin/python3
  args: ["@ROOT@/bin/fixture.py", "{fs.read}"]
  tools: [dirs, read, whoami, crash, sleep, cancelled]
  startup_timeout_ms: 10000
sandbox:
  runtime: ["@ROOT@/bin/fixture.py"]
  fs.read: [/]
"#;

#[tokio::test]
async fn mcp_server_is_proxied_sandboxed_restarted_and_forgotten() {
    skip_unless_capable!();
    let bed = Bed::new("mcp", true);
    bed.program("fixture.py", FIXTURE_PY);
    let root = bed.root();
    let tools = bed.tools(&[("fx.yaml", FX)]);
    let c = &bed.caller;
    assert_eq!(
        tools.capability_of("fx.read").as_deref(),
        Some("fx"),
        "known before any server runs"
    );
    assert!(tools.servers_of(&c.agent).await.is_empty());

    let list = tools.list(c).await;
    let mut names: Vec<&str> = list.iter().map(|d| d.name.as_str()).collect();
    names.sort();
    assert_eq!(
        names,
        [
            "fx.cancelled",
            "fx.crash",
            "fx.dirs",
            "fx.read",
            "fx.sleep",
            "fx.whoami"
        ]
    );
    assert!(list.iter().all(|d| d.capability == "fx"));
    let servers = tools.servers_of(&c.agent).await;
    assert_eq!(servers.len(), 1, "{servers:?}");
    let pid1 = servers[0].1;

    // The server was told the caller's readable directories within the manifest's bound.
    let r = tools.call(c, "fx.dirs", json!({}), never()).await.unwrap();
    let mut dirs: Vec<String> = serde_json::from_value(structured(&r)["dirs"].clone()).unwrap();
    dirs.sort();
    assert_eq!(
        dirs,
        [
            root.join("granted").display().to_string(),
            root.join("home").display().to_string()
        ]
    );

    let r = tools
        .call(c, "fx.whoami", json!({}), never())
        .await
        .unwrap();
    assert_eq!(structured(&r)["uid"], c.uid);
    assert!(
        structured(&r)["cgroup"]
            .as_str()
            .unwrap()
            .contains("/tools/mcp-fx-t_mcp-"),
        "{r}"
    );

    let granted = root.join("granted/data").display().to_string();
    let outside = root.join("outside/secret").display().to_string();
    let r = tools
        .call(c, "fx.read", json!({"path": granted}), never())
        .await
        .unwrap();
    assert_eq!(r["content"][0]["text"], "granted data\n");
    // The server has no path check of its own; Landlock refuses.
    let r = tools
        .call(c, "fx.read", json!({"path": outside}), never())
        .await
        .unwrap();
    assert_eq!(r["isError"], true);
    assert_eq!(structured(&r)["errno"], 13, "{r}");

    // Arguments are checked against the server's own schema before they are forwarded.
    assert!(matches!(
        tools
            .call(c, "fx.read", json!({"file": "x"}), never())
            .await,
        Err(ToolError::InvalidArguments { .. })
    ));
    assert!(matches!(
        tools.call(c, "fx.hidden", json!({}), never()).await,
        Err(ToolError::UnknownTool(_))
    ));

    // Timeout: the caller gets Timeout, the server gets notifications/cancelled.
    let r = tools
        .call(c, "fx.sleep", json!({"seconds": 5}), never())
        .await;
    assert!(matches!(r, Err(ToolError::Timeout { .. })), "{r:?}");
    let (tx, rx) = tokio::sync::oneshot::channel();
    let call = tools.call(c, "fx.sleep", json!({"seconds": 5}), rx);
    let cancel = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        tx.send(()).unwrap();
    };
    let (r, ()) = tokio::join!(call, cancel);
    assert!(matches!(r, Err(ToolError::Cancelled(_))), "{r:?}");
    let r = tools
        .call(c, "fx.cancelled", json!({}), never())
        .await
        .unwrap();
    assert_eq!(structured(&r)["ids"].as_array().unwrap().len(), 2, "{r}");

    // The server dies: the call fails, the next one gets a fresh server.
    let r = tools.call(c, "fx.crash", json!({}), never()).await;
    assert!(
        matches!(&r, Err(ToolError::Failed(m)) if m.contains("exited")),
        "{r:?}"
    );
    let r = tools
        .call(c, "fx.read", json!({"path": granted}), never())
        .await
        .unwrap();
    assert_eq!(r["content"][0]["text"], "granted data\n");
    let servers = tools.servers_of(&c.agent).await;
    assert_eq!(servers.len(), 1);
    assert_ne!(servers[0].1, pid1, "not restarted");
    assert_eq!(
        bed.tool_cgroups().len(),
        1,
        "the dead server's cgroup is left: {:?}",
        bed.tool_cgroups()
    );

    // Another agent gets its own instance, with its own scope.
    let mut other = c.clone();
    other.agent = "t/other".into();
    other.grants.fs_read.clear();
    let r = tools
        .call(&other, "fx.read", json!({"path": granted}), never())
        .await
        .unwrap();
    assert_eq!(structured(&r)["errno"], 13, "{r}");
    assert_eq!(bed.tool_cgroups().len(), 2);

    // forget stops that agent's servers and removes their cgroups.
    let pid2 = servers[0].1;
    tools.forget(&c.agent).await;
    assert!(tools.servers_of(&c.agent).await.is_empty());
    assert!(
        !Path::new(&format!("/proc/{pid2}")).exists()
            || std::fs::read_to_string(format!("/proc/{pid2}/stat"))
                .map(|s| s.contains(") Z"))
                .unwrap_or(true)
    );
    assert_eq!(bed.tool_cgroups().len(), 1, "{:?}", bed.tool_cgroups());
    tools.shutdown().await;
    assert!(bed.tool_cgroups().is_empty(), "{:?}", bed.tool_cgroups());
    let scratch = bed.cfg.state_dir.join("tools/scratch");
    assert_eq!(
        std::fs::read_dir(&scratch).map(|d| d.count()).unwrap_or(0),
        0,
        "scratch left behind"
    );
}

/// An MCP server that answers `initialize` only once `@ROOT@/granted/go` exists.
const GATED_PY: &str = r#"
import json, os, sys, time
go = sys.argv[1]
while not os.path.exists(go): time.sleep(0.05)
def send(m): sys.stdout.write(json.dumps(m) + "\n"); sys.stdout.flush()
for line in sys.stdin:
    m = json.loads(line)
    meth, id = m.get("method"), m.get("id")
    if meth == "initialize":
        send({"jsonrpc": "2.0", "id": id, "result": {"protocolVersion": m["params"]["protocolVersion"],
              "capabilities": {"tools": {}}, "serverInfo": {"name": "gated", "version": "1"}}})
    elif meth == "tools/list":
        send({"jsonrpc": "2.0", "id": id, "result": {"tools": [{"name": "t", "inputSchema": {"type": "object"}}]}})
    elif id is not None: send({"jsonrpc": "2.0", "id": id, "error": {"code": -32601, "message": "no " + meth}})
"#;

fn gated_manifest(name: &str) -> String {
    format!(
        r#"
name: {name}
description: starts when the test says so
risk: low
mcp:
  command: /usr/bin/python3
  args: ["@ROOT@/bin/gated.py", "@ROOT@/granted/go"]
  startup_timeout_ms: 30000
sandbox:
  runtime: ["@ROOT@/bin/gated.py"]
  fs.read: [/]
"#
    )
}

/// A listing starts the caller's MCP servers together: it waits for the slowest start, not
/// for the sum of them (a caller with several slow servers would otherwise see its listing
/// time out while each server is within its own startup timeout).
#[tokio::test]
async fn a_listing_starts_the_callers_servers_together() {
    skip_unless_capable!();
    let bed = Bed::new("gated", true);
    bed.program("gated.py", GATED_PY);
    let (a, b) = (gated_manifest("slow.a"), gated_manifest("slow.b"));
    let tools = bed.tools(&[("slow.a.yaml", &a), ("slow.b.yaml", &b)]);
    let listing = {
        let (tools, c) = (tools.clone(), bed.caller.clone());
        tokio::spawn(async move { tools.list(&c).await })
    };
    // Both servers are started (each in its own tool cgroup) before either may answer.
    let t0 = Instant::now();
    let mut seen = 0;
    while t0.elapsed() < Duration::from_secs(15) {
        seen = bed.tool_cgroups().len();
        if seen == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    std::fs::write(bed.root().join("granted/go"), "").unwrap();
    let list = listing.await.unwrap();
    let mut names: Vec<&str> = list.iter().map(|d| d.name.as_str()).collect();
    names.sort();
    assert_eq!(names, ["slow.a.t", "slow.b.t"], "{list:?}");
    assert_eq!(
        seen,
        2,
        "the second server was not started while the first waited for its answer: {:?}",
        bed.tool_cgroups()
    );
    tools.shutdown().await;
}

/// examples/tools/files.yaml with the published `@modelcontextprotocol/server-filesystem`,
/// when it is installed: `npm install --prefix DIR @modelcontextprotocol/server-filesystem`
/// and `AGENTOS_TEST_FS_SERVER=DIR`.
#[tokio::test]
async fn files_example_with_the_published_filesystem_server() {
    skip_unless_capable!();
    // The npm prefix `cargo xtask mcp-peers` installs (`$AGENTOS_MCP_PEERS/node`), or one named
    // by AGENTOS_TEST_FS_SERVER.
    let prefix = std::env::var_os("AGENTOS_TEST_FS_SERVER")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            std::env::var_os("AGENTOS_MCP_PEERS")
                .map(PathBuf::from)
                .unwrap_or_else(|| {
                    Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/mcp-peers")
                })
                .join("node")
        });
    let server = prefix.join("node_modules/@modelcontextprotocol/server-filesystem/dist/index.js");
    if !server.exists() {
        common::skip(
            "files_example_with_the_published_filesystem_server",
            &format!(
                "{} is missing: run `cargo xtask mcp-peers`",
                server.display()
            ),
        );
        return;
    }
    let prefix = prefix.canonicalize().unwrap();
    let bed = Bed::new("files", true);
    let root = bed.root();
    let manifest = std::fs::read_to_string(examples().join("files.yaml"))
        .unwrap()
        .replace("/opt/agentos/tools", &prefix.display().to_string());
    let controllers =
        std::fs::read_to_string(bed.cfg.cgroup_root.path().join("cgroup.controllers"))
            .unwrap_or_default();
    let manifest = if controllers.contains("pids") && controllers.contains("memory") {
        manifest
    } else {
        manifest.split("\nlimits:").next().unwrap().to_string()
    };
    let tools = bed.tools(&[("files.yaml", &manifest)]);
    // A call starts the server and says why when it cannot.
    let r = tools
        .call(
            &bed.caller,
            "files.list_allowed_directories",
            json!({}),
            never(),
        )
        .await;
    assert!(r.is_ok(), "{r:?}");
    let list = tools.list(&bed.caller).await;
    let names: Vec<&str> = list.iter().map(|d| d.name.as_str()).collect();
    assert!(names.contains(&"files.read_text_file"), "{names:?}");
    let granted = root.join("granted/data").display().to_string();
    let outside = root.join("outside/secret").display().to_string();
    let r = tools
        .call(
            &bed.caller,
            "files.read_text_file",
            json!({"path": granted}),
            never(),
        )
        .await
        .unwrap();
    assert_eq!(r["content"][0]["text"], "granted data\n", "{r}");
    let r = tools
        .call(
            &bed.caller,
            "files.read_text_file",
            json!({"path": outside}),
            never(),
        )
        .await
        .unwrap();
    assert_eq!(r["isError"], true, "{r}");
    assert!(!r.to_string().contains("outside data"), "{r}");
    let r = tools
        .call(
            &bed.caller,
            "files.list_allowed_directories",
            json!({}),
            never(),
        )
        .await
        .unwrap();
    let text = r["content"][0]["text"].as_str().unwrap();
    assert!(
        text.contains(&root.join("granted").display().to_string()) && !text.contains("outside"),
        "{text}"
    );
    tools.shutdown().await;
    assert!(bed.tool_cgroups().is_empty(), "{:?}", bed.tool_cgroups());
}
