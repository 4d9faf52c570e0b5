//! Contract budgets become cgroup v2 limits the kernel enforces: memory.max, pids.max, cpu.max,
//! io.max.

use std::time::{Duration, Instant};

use vm_tests::{
    Agent, agentctl, cg_key, cmd, contract_yaml, helper, read_cg, require_vm, wait_for,
    write_contract,
};

#[test]
#[ignore = "needs the guest VM: run `cargo xtask vm test`"]
fn memory_hog_is_oom_killed_in_its_own_cgroup() {
    require_vm();
    let hog = helper("vmt-hog");
    // 256 MiB against a 64 MiB budget, after 3 s (to read the cgroup first).
    let c = write_contract(
        "vmt-memhog",
        &contract_yaml(
            "vmt-memhog",
            &hog,
            &["256", "3"],
            "cpu: \"1\", mem: \"64MiB\", pids: 16",
        ),
    );
    let agent = Agent::start("vmt-memhog", &c);
    let cg = agent.cgroup();
    assert_eq!(
        read_cg(&cg, "memory.max"),
        (64u64 << 20).to_string(),
        "memory.max"
    );
    let parent = cg
        .parent()
        .expect("agent cgroup has a parent")
        .to_path_buf();
    let parent_before = cg_key(&parent, "memory.events", "oom_kill");

    // The kill happens in the agent's cgroup: its own memory.events counts it.
    let own = wait_for(
        "oom_kill in the agent's memory.events",
        Duration::from_secs(60),
        || {
            if !cg.is_dir() {
                return Some(None);
            }
            let n = std::fs::read_to_string(cg.join("memory.events"))
                .ok()
                .and_then(|t| {
                    t.lines()
                        .find_map(|l| l.strip_prefix("oom_kill "))
                        .and_then(|v| v.trim().parse::<u64>().ok())
                })?;
            (n >= 1).then_some(Some(n))
        },
    );
    match own {
        Some(n) => assert!(n >= 1),
        None => {
            // The daemon already removed the cgroup: the kill still shows one level up.
            let after = cg_key(&parent, "memory.events", "oom_kill");
            assert!(
                after > parent_before,
                "no oom_kill recorded below {}",
                parent.display()
            );
        }
    }
    // Only the agent was hit: the daemon is alive and answers.
    agentctl(&["list"]).ok();
    // The daemon reports it: failed, and its result names the OOM kill (like systemd's
    // `Result=oom-kill`), not just "signal".
    let v = agent.wait_state("failed", Duration::from_secs(30));
    let result = v["result"].as_str().unwrap_or("").to_ascii_lowercase();
    assert!(
        result.contains("oom"),
        "result {result:?} does not name the OOM kill: {v}"
    );
}

#[test]
#[ignore = "needs the guest VM: run `cargo xtask vm test`"]
fn fork_bomb_stops_at_pids_max() {
    require_vm();
    let c = write_contract(
        "vmt-forkbomb",
        &contract_yaml(
            "vmt-forkbomb",
            "/bin/sh",
            &["-c", "f() { f | f & }; f; exec sleep 3600"],
            "cpu: \"0.5\", mem: \"128MiB\", pids: 16",
        ),
    );
    let agent = Agent::start("vmt-forkbomb", &c);
    let cg = agent.cgroup();
    assert_eq!(read_cg(&cg, "pids.max"), "16");
    wait_for("pids.events max >= 1", Duration::from_secs(60), || {
        (cg_key(&cg, "pids.events", "max") >= 1).then_some(())
    });
    let current: u64 = read_cg(&cg, "pids.current").parse().expect("pids.current");
    assert!(current <= 16, "pids.current {current} over pids.max 16");
    // The daemon stays responsive while the bomb runs.
    let t = Instant::now();
    agentctl(&["list"]).ok();
    agentctl(&["status", "vmt-forkbomb"]).ok();
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "agentctl took {:?} during the fork bomb",
        t.elapsed()
    );
    // Stopping it ends every process of the bomb.
    agentctl(&["stop", "vmt-forkbomb"]).ok();
    wait_for(
        "the fork bomb's cgroup to empty",
        Duration::from_secs(30),
        || {
            // `populated` covers the agent's `main` leaf and its tools below it.
            let empty = std::fs::read_to_string(cg.join("cgroup.events"))
                .map_or(true, |t| t.lines().any(|l| l == "populated 0"));
            empty.then_some(())
        },
    );
}

#[test]
#[ignore = "needs the guest VM: run `cargo xtask vm test`"]
fn cpu_max_throttles_a_busy_loop() {
    require_vm();
    let c = write_contract(
        "vmt-cpu",
        &contract_yaml(
            "vmt-cpu",
            "/bin/sh",
            &["-c", "while :; do :; done"],
            "cpu: \"0.1\", mem: \"32MiB\", pids: 8",
        ),
    );
    let agent = Agent::start("vmt-cpu", &c);
    agent.wait_state("running", Duration::from_secs(30));
    let cg = agent.cgroup();
    let max = read_cg(&cg, "cpu.max");
    let (quota, period) = max.split_once(' ').expect("cpu.max is `QUOTA PERIOD`");
    let quota: f64 = quota
        .parse()
        .unwrap_or_else(|_| panic!("cpu.max quota in {max:?}"));
    let period: f64 = period.parse().expect("cpu.max period");
    assert!(
        (quota / period - 0.1).abs() < 1e-6,
        "cpu.max {max:?} is not 0.1 CPU"
    );

    // Under the sched_ext scheduler scx_agentos (the VM install enables it) the scheduler
    // enforces cpu.max itself and the kernel's CFS counters (nr_throttled, throttled_usec) stay
    // 0: there the usage below is the evidence.
    let scx = std::fs::read_to_string("/sys/kernel/sched_ext/state")
        .is_ok_and(|s| s.trim() == "enabled")
        && std::fs::read_to_string("/sys/kernel/sched_ext/root/ops")
            .is_ok_and(|o| o.trim().starts_with("agentos"));
    let usage0 = cg_key(&cg, "cpu.stat", "usage_usec");
    let t0 = Instant::now();
    if scx {
        std::thread::sleep(Duration::from_secs(5));
    } else {
        wait_for("cpu.stat nr_throttled > 0", Duration::from_secs(30), || {
            (cg_key(&cg, "cpu.stat", "nr_throttled") > 0).then_some(())
        });
        std::thread::sleep(Duration::from_secs(3));
    }
    let used = (cg_key(&cg, "cpu.stat", "usage_usec") - usage0) as f64 / 1e6;
    let wall = t0.elapsed().as_secs_f64();
    if !scx {
        assert!(cg_key(&cg, "cpu.stat", "throttled_usec") > 0);
    }
    // 0.1 CPU, with room for the period boundaries and emulation jitter.
    assert!(
        used <= 0.2 * wall,
        "the busy loop used {used:.2} s of CPU in {wall:.2} s under cpu.max {max}"
    );
}

#[test]
#[ignore = "needs the guest VM: run `cargo xtask vm test`"]
fn io_max_throttles_direct_writes() {
    require_vm();
    // A block device of our own: a loop device over a file in the guest's RAM root.
    cmd("modprobe", &["loop"]).ok();
    let img = "/var/tmp/vmt-io.img";
    cmd("truncate", &["-s", "64M", img]).ok();
    let dev = cmd("losetup", &["--find", "--show", img])
        .ok()
        .stdout
        .trim()
        .to_string();
    assert!(dev.starts_with("/dev/loop"), "losetup gave {dev:?}");
    // The agent's own uid must be able to open it; Landlock grants it below.
    cmd("chmod", &["0666", &dev]).ok();
    let script = format!(
        "dd if=/dev/zero of={dev} bs=64k count=48 oflag=direct 2>&1; echo DD-DONE; exec sleep 600"
    );
    let mut text = contract_yaml(
        "vmt-io",
        "/bin/sh",
        &["-c", &script],
        &format!("mem: \"64MiB\", pids: 16, io: [{{ device: {dev}, wbps: \"1MiB\" }}]"),
    );
    text.push_str(&format!("capabilities:\n  - fs.write: [{dev}]\n"));
    let c = write_contract("vmt-io", &text);
    let t = Instant::now();
    let agent = Agent::start("vmt-io", &c);
    let cg = agent.cgroup();
    let rdev = cmd("stat", &["-c", "%t:%T", &dev]).ok().stdout;
    let (maj, min) = rdev.trim().split_once(':').expect("stat %t:%T");
    let majmin = format!(
        "{}:{}",
        u32::from_str_radix(maj, 16).expect("major"),
        u32::from_str_radix(min, 16).expect("minor")
    );
    assert_eq!(
        read_cg(&cg, "io.max"),
        format!("{majmin} rbps=max wbps=1048576 riops=max wiops=max"),
        "io.max"
    );
    // 3 MiB at 1 MiB/s: the kernel holds the writes back for about 2 s or more.
    wait_for("dd to finish", Duration::from_secs(60), || {
        agentctl(&["logs", "vmt-io"])
            .stdout
            .contains("DD-DONE")
            .then_some(())
    });
    let took = t.elapsed();
    let log = agentctl(&["logs", "vmt-io"]).stdout;
    assert!(
        log.contains("3145728 bytes"),
        "dd did not write 3 MiB:\n{log}"
    );
    let written = read_cg(&cg, "io.stat")
        .split_whitespace()
        .find_map(|kv| {
            kv.strip_prefix("wbytes=")
                .and_then(|v| v.parse::<u64>().ok())
        })
        .unwrap_or(0);
    assert!(written >= 3 << 20, "io.stat wbytes {written}");
    assert!(
        took >= Duration::from_millis(1800),
        "3 MiB under wbps=1MiB took only {took:?}:\n{log}"
    );
    drop(agent);
    cmd("losetup", &["-d", &dev]).ok();
    let _ = std::fs::remove_file(img);
}

/// Issue 12, class 6: a tool's processes live in its agent's cgroup subtree, so the agent's
/// `pids.max` counts the agent and its tool together and the tool is refused (EAGAIN) at the
/// limit, although its own manifest limit (pids 256) is far away.
#[test]
#[ignore = "needs the guest VM: run `cargo xtask vm test`"]
fn a_tool_counts_against_its_agents_pids_max() {
    require_vm();
    std::fs::create_dir_all("/etc/agentos/tools.d").unwrap();
    let forker = helper("vmt-forker");
    let manifest = "/etc/agentos/tools.d/vmt-forker.yaml";
    std::fs::write(
        manifest,
        format!(
            "apiVersion: agentos/v0.2\nkind: Tool\nname: vmt.forker\n\
             description: Start tasks until refused (budgets VM test).\nrisk: low\n\
             timeout_ms: 30000\nexec:\n  command: {forker}\n  args: [\"64\"]\n\
             input_schema: {{type: object}}\nsandbox:\n  runtime: [{forker}]\n\
             limits:\n  pids: 256\n"
        ),
    )
    .unwrap();
    // Tools are loaded when the daemon starts.
    vm_tests::systemctl(&["restart", "agentosd"]).ok();
    wait_for("agentosd back", Duration::from_secs(60), || {
        agentctl(&["list"]).success().then_some(())
    });
    // The agent holds a few tasks of its own (the shell, sleeps, the bridge) while it calls.
    let script = vm_tests::bridge_script(
        "sleep 600 & sleep 600 & ",
        &[vm_tests::tool_call(2, "vmt.forker")],
        "; sleep 600",
    );
    let yaml = format!(
        "apiVersion: agentos/v0.2\nkind: AgentContract\nname: vmt-tooltasks\nclass: {{ latency: DT }}\n\
         exec: {{ command: /bin/sh, args: [\"-c\", {}] }}\nrestart: {{ policy: \"no\" }}\n\
         capabilities: [vmt.forker]\ncompute: {{ cpu: \"1\", mem: \"256MiB\", pids: 24 }}\n",
        serde_json::to_string(&script).unwrap()
    );
    let agent = Agent::start("vmt-tooltasks", &write_contract("vmt-tooltasks", &yaml));
    let cg = agent.cgroup();
    assert_eq!(read_cg(&cg, "pids.max"), "24");
    assert!(
        cg.join("main").is_dir(),
        "the agent's processes live in {}/main",
        cg.display()
    );
    let log = "/var/lib/agentos/logs/default/vmt-tooltasks.log";
    let text = wait_for("the tool call to finish", Duration::from_secs(90), || {
        let t = std::fs::read_to_string(log).unwrap_or_default();
        t.contains("bridge-exit=").then_some(t)
    });
    let reply: serde_json::Value = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["id"] == 2)
        .unwrap_or_else(|| panic!("no reply to the tool call in {text}"));
    let out = &reply["result"]["structuredContent"];
    let spawned = out["spawned"]
        .as_u64()
        .unwrap_or_else(|| panic!("no structured result: {reply}"));
    assert_eq!(
        out["errno"], 11,
        "the tool's task was not refused with EAGAIN at the agent's pids.max: {reply}"
    );
    // The tool (its main thread + what it spawned) and the agent (the shell, two sleeps, the
    // bridge: at least 4 tasks) fit together under 24; alone the tool could have had 64.
    assert!(
        spawned + 1 + 4 <= 24,
        "the tool got {spawned} tasks: the agent's own were not counted with it: {reply}"
    );
    assert!(
        cg_key(&cg, "pids.events", "max") >= 1,
        "the refusal is the agent's pids.max"
    );
    // The tool's cgroup went with the call; stop ends everything of the agent.
    agentctl(&["stop", "vmt-tooltasks"]).ok();
    wait_for("the agent's cgroup to go", Duration::from_secs(30), || {
        (!cg.exists()).then_some(())
    });
    let _ = std::fs::remove_file(manifest);
    vm_tests::systemctl(&["restart", "agentosd"]).ok();
}
