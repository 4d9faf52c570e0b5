//! The agents' sockets (ipc/) and the `agentos-mcp` bridge, end to end on the host.
//!
//! Tests that need cgroups run as root with a cgroup2 mount and skip with a message otherwise;
//! `pair()` and bridge tests need only io_uring. Time bounds are generous (seconds): they catch
//! starvation and hangs, not speed.

mod common;

use std::ffi::CString;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agentosd::ipc::{AgentRef, Connection, Inbound, IpcError, IpcServer, Limits, Peer, Refusal};
use common::TestCgroup;

/// The ipc server on its own tokio runtime, with an echo service behind it: every line comes
/// back as is; `{"too_long":N}` answers an over-long line; agents whose name ends in `noread`
/// get their connections parked unread; `__burst N__` answers N lines then closes.
struct Server {
    rt: tokio::runtime::Runtime,
    ipc: Option<Arc<IpcServer>>,
    peers: std::sync::mpsc::Receiver<Peer>,
    refusals: tokio::sync::mpsc::Receiver<Refusal>,
    parked: Arc<Mutex<Vec<Connection>>>,
    closed: std::sync::mpsc::Receiver<u64>,
}

impl Server {
    /// None (with a printed reason) when this kernel gives no io_uring.
    fn start(limits: Limits) -> Option<Server> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("tokio runtime");
        let (ipc, incoming) = common::start_ipc(&rt, limits, module_path!())?;
        let (peers_tx, peers) = std::sync::mpsc::channel();
        let (closed_tx, closed) = std::sync::mpsc::channel();
        let parked = Arc::new(Mutex::new(Vec::new()));
        let park = parked.clone();
        let mut conns = incoming.conns;
        rt.spawn(async move {
            while let Some(c) = conns.recv().await {
                let _ = peers_tx.send(c.peer.clone());
                if c.peer.agent.ends_with("noread") {
                    park.lock().expect("park").push(c);
                    continue;
                }
                let closed_tx = closed_tx.clone();
                tokio::spawn(async move {
                    let Connection { peer, mut rx, tx } = c;
                    while let Some(m) = rx.recv().await {
                        let reply = match m {
                            Inbound::Line(l) => l,
                            Inbound::TooLong { len } => format!("{{\"too_long\":{len}}}").into(),
                        };
                        if let Some(n) = std::str::from_utf8(&reply)
                            .ok()
                            .and_then(|s| s.strip_prefix("__burst "))
                            .and_then(|s| s.strip_suffix("__"))
                            .and_then(|s| s.parse::<usize>().ok())
                        {
                            for i in 0..n {
                                let _ = tx.send(format!("{{\"burst\":{i}}}").into()).await;
                            }
                            tx.close();
                            continue;
                        }
                        if tx.send(reply).await.is_err() {
                            break;
                        }
                    }
                    let _ = closed_tx.send(peer.conn);
                });
            }
        });
        Some(Server {
            rt,
            ipc: Some(ipc),
            peers,
            refusals: incoming.refusals,
            parked,
            closed,
        })
    }

    fn ipc(&self) -> &IpcServer {
        self.ipc.as_ref().expect("server running")
    }

    fn peer(&self) -> Peer {
        self.peers
            .recv_timeout(Duration::from_secs(10))
            .expect("a connection reaches the daemon within 10 s")
    }

    fn refusal(&mut self) -> Refusal {
        let r = &mut self.refusals;
        self.rt
            .block_on(async { tokio::time::timeout(Duration::from_secs(10), r.recv()).await })
            .expect("a refusal within 10 s")
            .expect("refusal channel open")
    }

    fn no_refusal(&mut self) {
        assert!(
            self.refusals.try_recv().is_err(),
            "unexpected refusal: {:?}",
            self.refusals.try_recv()
        );
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.parked.lock().map(|mut p| p.clear()).ok();
        drop(self.ipc.take());
    }
}

/// An agent cgroup `<test cgroup>/agents/t/<name>` and its AgentRef.
struct AgentBed {
    agent: AgentRef,
}

fn agent_in(cg: &TestCgroup, name: &str) -> AgentBed {
    let mount = agentosd::cgroup::cgroup2_mount().expect("cgroup2 mount");
    let dir = cg.path.join("agents/t").join(name);
    std::fs::create_dir_all(&dir).expect("create agent cgroup");
    let rel = dir.strip_prefix(&mount).expect("under the mount");
    AgentBed {
        agent: AgentRef {
            id: format!("t/{name}"),
            cgroup: Path::new("/").join(rel),
            cgroup_dir: dir,
            uid: 65534,
            gid: 65534,
        },
    }
}

use common::paired_agent;

/// Run `cmd` with its process moved into `cgroup_dir` before exec.
fn spawn_in_cgroup(cmd: &mut Command, cgroup_dir: &Path) -> Child {
    let procs = CString::new(
        cgroup_dir
            .join("cgroup.procs")
            .into_os_string()
            .into_encoded_bytes(),
    )
    .expect("path without NUL");
    // SAFETY: the closure runs in the forked child before exec and only calls open/write/close,
    // which are async-signal-safe, on a CString built before the fork; it allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let n = libc::write(fd, b"0".as_ptr().cast(), 1);
            let err = std::io::Error::last_os_error();
            libc::close(fd);
            if n != 1 {
                return Err(err);
            }
            Ok(())
        });
    }
    cmd.spawn().expect("spawn child in cgroup")
}

/// `agentos-mcp --socket PATH` inside `cgroup_dir`, stdin/stdout piped.
fn bridge_in(cgroup_dir: &Path, sock: &Path) -> Child {
    spawn_in_cgroup(
        Command::new(common::bridge_bin())
            .arg("--socket")
            .arg(sock)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
        cgroup_dir,
    )
}

fn wait_exit(child: &mut Child, secs: u64) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(st) = child.try_wait().expect("try_wait") {
            return st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("child {} did not exit within {secs} s", child.id());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn stream(fd: OwnedFd) -> UnixStream {
    let s = UnixStream::from(fd);
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("read timeout");
    s
}

fn read_line(r: &mut impl BufRead) -> String {
    let mut l = String::new();
    r.read_line(&mut l).expect("read a line within 10 s");
    l
}

fn sock_path(dir: &tempfile::TempDir, name: &str) -> PathBuf {
    dir.path().join("agents/t").join(format!("{name}.sock"))
}

#[test]
fn listen_echoes_for_processes_in_the_agent_cgroup_or_below() {
    skip_unless_capable!();
    let Some(mut srv) = Server::start(Limits::default()) else {
        return;
    };
    let cg = TestCgroup::new("ipc-echo");
    let bed = agent_in(&cg, "echo");
    let dir = tempfile::tempdir().expect("tempdir");
    let path = sock_path(&dir, "echo");
    // A stale socket file from an earlier daemon is replaced.
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    drop(UnixListener::bind(&path).expect("stale socket"));
    srv.ipc().listen(&bed.agent, &path).expect("listen");
    // Listening again on the same path (agent restarted) replaces the listener.
    srv.ipc().listen(&bed.agent, &path).expect("listen again");
    let deadline = Instant::now() + Duration::from_secs(10);
    while srv.ipc().stats().listeners != 1 {
        assert!(Instant::now() < deadline, "{:?}", srv.ipc().stats());
        std::thread::sleep(Duration::from_millis(20));
    }

    let meta = std::fs::metadata(&path).expect("socket exists");
    assert_eq!(meta.permissions().mode() & 0o777, 0o600, "socket mode");
    assert_eq!((meta.uid(), meta.gid()), (65534, 65534), "socket owner");

    for cgdir in [
        bed.agent.cgroup_dir.clone(),
        bed.agent.cgroup_dir.join("tools/sub"),
    ] {
        std::fs::create_dir_all(&cgdir).expect("cgroup");
        let mut child = bridge_in(&cgdir, &path);
        let mut stdin = child.stdin.take().expect("stdin");
        let mut out = BufReader::new(child.stdout.take().expect("stdout"));
        stdin
            .write_all(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\n{\"id\":2}\n")
            .expect("write");
        assert_eq!(
            read_line(&mut out),
            "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\n"
        );
        assert_eq!(read_line(&mut out), "{\"id\":2}\n");
        let peer = srv.peer();
        assert_eq!(peer.agent, "t/echo");
        assert_eq!(
            peer.pid,
            Some(child.id()),
            "peer pid is the connecting process"
        );
        assert_eq!(peer.uid, 0);
        assert!(!peer.inherited);
        drop(stdin);
        let st = wait_exit(&mut child, 10);
        assert!(st.success(), "bridge exit {st}");
        srv.no_refusal();
    }
    let s = srv.ipc().stats();
    assert_eq!(s.accepted, 2, "{s:?}");
    assert_eq!(s.lines_in, 4, "{s:?}");
    assert_eq!(s.lines_out, 4, "{s:?}");
    assert_eq!(s.refused, 0, "{s:?}");
}

#[test]
fn peers_outside_the_agent_cgroup_are_refused_without_a_byte() {
    skip_unless_capable!();
    let Some(mut srv) = Server::start(Limits::default()) else {
        return;
    };
    let cg = TestCgroup::new("ipc-refuse");
    let bed = agent_in(&cg, "a");
    // A sibling whose path shares the agent's as a string prefix: /agents/t/a vs /agents/t/ab.
    let sibling = agent_in(&cg, "ab");
    let dir = tempfile::tempdir().expect("tempdir");
    let path = sock_path(&dir, "a");
    srv.ipc().listen(&bed.agent, &path).expect("listen");

    // The test process itself (not in the agent's cgroup).
    let mut s = UnixStream::connect(&path).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let _ = s.write_all(b"{\"id\":1}\n");
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    assert!(got.is_empty(), "refused peer got bytes: {got:?}");
    let r = srv.refusal();
    assert_eq!(r.agent, "t/a");
    assert_eq!(r.pid, Some(std::process::id()));
    assert_eq!(r.cgroup, Some(common::proc_cgroup(std::process::id())));
    assert!(
        r.reason.contains("not in the agent's cgroup"),
        "{}",
        r.reason
    );

    // A process in the sibling cgroup.
    let mut child = bridge_in(&sibling.agent.cgroup_dir, &path);
    let mut stdin = child.stdin.take().expect("stdin");
    let _ = stdin.write_all(b"{\"id\":1}\n");
    let mut out = Vec::new();
    child
        .stdout
        .take()
        .expect("stdout")
        .read_to_end(&mut out)
        .expect("read");
    assert!(out.is_empty(), "refused bridge printed {out:?}");
    let r = srv.refusal();
    assert_eq!(r.pid, Some(child.id()));
    assert_eq!(
        r.cgroup.as_deref(),
        Some(sibling.agent.cgroup.to_str().expect("utf8"))
    );
    drop(stdin);
    wait_exit(&mut child, 10);
    let s = srv.ipc().stats();
    assert_eq!((s.accepted, s.refused), (0, 2), "{s:?}");
}

/// The agent is its process leaf `agents/t/<name>/main`; its tools run beside it in
/// `agents/t/<name>/tools/…` (same budgets, same uid): a tool process is refused on the agent's
/// socket, the agent's own process is accepted (issue 12, class 6).
#[test]
fn a_tool_process_cannot_pose_as_its_agent() {
    skip_unless_capable!();
    let Some(mut srv) = Server::start(Limits::default()) else {
        return;
    };
    let cg = TestCgroup::new("ipc-tool");
    let bed = agent_in(&cg, "a/main");
    let tool = cg.path.join("agents/t/a/tools/call-1-x");
    std::fs::create_dir_all(&tool).expect("tool cgroup");
    let dir = tempfile::tempdir().expect("tempdir");
    let path = sock_path(&dir, "a");
    srv.ipc().listen(&bed.agent, &path).expect("listen");

    let mut child = bridge_in(&tool, &path);
    let mut stdin = child.stdin.take().expect("stdin");
    let _ = stdin.write_all(b"{\"id\":1}\n");
    let mut out = Vec::new();
    child
        .stdout
        .take()
        .expect("stdout")
        .read_to_end(&mut out)
        .expect("read");
    assert!(out.is_empty(), "the tool process got bytes: {out:?}");
    let r = srv.refusal();
    assert_eq!(r.pid, Some(child.id()));
    assert!(
        r.reason.contains("not in the agent's cgroup"),
        "{}",
        r.reason
    );
    drop(stdin);
    wait_exit(&mut child, 10);

    // The control: the agent's own process (in `main`) is served.
    let mut child = bridge_in(&bed.agent.cgroup_dir, &path);
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(b"{\"id\":2}\n").expect("write");
    drop(stdin);
    let _peer = srv.peer();
    wait_exit(&mut child, 10);
    let s = srv.ipc().stats();
    assert_eq!((s.accepted, s.refused), (1, 1), "{s:?}");
}

#[test]
fn pair_gives_an_inherited_connection() {
    let Some(srv) = Server::start(Limits::default()) else {
        return;
    };
    let fd = srv.ipc().pair(&paired_agent("p")).expect("pair");
    let s = stream(fd);
    let mut r = BufReader::new(s.try_clone().expect("clone"));
    (&s).write_all(b"{\"id\":7}\n").expect("write");
    assert_eq!(read_line(&mut r), "{\"id\":7}\n");
    let peer = srv.peer();
    assert!(peer.inherited);
    assert_eq!(
        (peer.agent.as_str(), peer.pid, peer.uid),
        ("t/p", None, 65534)
    );
    // Peer close ends the daemon's side.
    drop(r);
    drop(s);
    let conn = srv
        .closed
        .recv_timeout(Duration::from_secs(10))
        .expect("the daemon sees the close");
    assert_eq!(conn, peer.conn);
    let deadline = Instant::now() + Duration::from_secs(10);
    while srv.ipc().stats().connections_open != 0 {
        assert!(Instant::now() < deadline, "connection not cleaned up");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn over_long_line_is_skipped_and_the_next_line_arrives() {
    let Some(srv) = Server::start(Limits::default()) else {
        return;
    };
    let s = stream(srv.ipc().pair(&paired_agent("long")).expect("pair"));
    let mut w = s.try_clone().expect("clone");
    let writer = std::thread::spawn(move || {
        let big = vec![b'x'; 2 << 20];
        w.write_all(&big).expect("write big");
        w.write_all(b"\n{\"after\":1}\n").expect("write after");
    });
    let mut r = BufReader::new(s);
    assert_eq!(read_line(&mut r), format!("{{\"too_long\":{}}}\n", 2 << 20));
    assert_eq!(read_line(&mut r), "{\"after\":1}\n");
    writer.join().expect("writer");
    let st = srv.ipc().stats();
    assert_eq!((st.too_long, st.lines_in), (1, 1), "{st:?}");
}

#[test]
fn outbox_close_sends_queued_lines_then_closes() {
    let Some(srv) = Server::start(Limits::default()) else {
        return;
    };
    let s = stream(srv.ipc().pair(&paired_agent("burst")).expect("pair"));
    (&s).write_all(b"__burst 1000__\n").expect("write");
    let mut all = String::new();
    BufReader::new(s)
        .read_to_string(&mut all)
        .expect("read to EOF within 10 s");
    let lines: Vec<&str> = all.lines().collect();
    assert_eq!(lines.len(), 1000, "all queued lines before EOF");
    assert_eq!(lines[999], "{\"burst\":999}");
}

#[test]
fn a_flooding_agent_does_not_starve_another() {
    let Some(srv) = Server::start(Limits::default()) else {
        return;
    };
    let stop = Arc::new(AtomicBool::new(false));
    let flooded = Arc::new(AtomicU64::new(0));
    let mut threads = Vec::new();
    // Agent "flood": writes 1 KiB lines as fast as it can and reads the echoes as fast as it can.
    let f = stream(srv.ipc().pair(&paired_agent("flood")).expect("pair"));
    {
        let (stop1, mut w) = (stop.clone(), f.try_clone().expect("clone"));
        threads.push(std::thread::spawn(move || {
            let mut line = vec![b'f'; 1023];
            line.push(b'\n');
            while !stop1.load(Ordering::Relaxed) {
                if w.write_all(&line).is_err() {
                    break;
                }
            }
        }));
        let (stop, flooded) = (stop.clone(), flooded.clone());
        threads.push(std::thread::spawn(move || {
            let mut r = BufReader::new(f);
            let mut l = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                l.clear();
                match r.read_until(b'\n', &mut l) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => flooded.fetch_add(1, Ordering::Relaxed),
                };
            }
        }));
    }
    // Agent "noread": its daemon side never reads, so its writer must be stopped by the kernel.
    let nr = stream(srv.ipc().pair(&paired_agent("noread")).expect("pair"));
    let pushed = Arc::new(AtomicU64::new(0));
    {
        let (stop, pushed, mut w) = (stop.clone(), pushed.clone(), nr.try_clone().expect("clone"));
        w.set_write_timeout(Some(Duration::from_millis(200)))
            .expect("timeout");
        threads.push(std::thread::spawn(move || {
            let mut line = vec![b'n'; 1023];
            line.push(b'\n');
            while !stop.load(Ordering::Relaxed) {
                match w.write(&line) {
                    Ok(n) => {
                        pushed.fetch_add(n as u64, Ordering::Relaxed);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        }));
    }
    std::thread::sleep(Duration::from_millis(500));
    // Agent "calm": 200 round trips while the others flood.
    let calm = stream(srv.ipc().pair(&paired_agent("calm")).expect("pair"));
    let mut r = BufReader::new(calm.try_clone().expect("clone"));
    let start = Instant::now();
    let mut worst = Duration::ZERO;
    for i in 0..200 {
        let t = Instant::now();
        (&calm)
            .write_all(format!("{{\"id\":{i}}}\n").as_bytes())
            .expect("write");
        assert_eq!(read_line(&mut r), format!("{{\"id\":{i}}}\n"));
        worst = worst.max(t.elapsed());
    }
    let total = start.elapsed();
    let noread_bytes = pushed.load(Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(500));
    let noread_later = pushed.load(Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    let flood_lines = flooded.load(Ordering::Relaxed);
    eprintln!(
        "calm: 200 round trips in {total:?}, worst {worst:?}; flood echoed {flood_lines} lines; \
         noread agent pushed {noread_bytes} bytes before blocking; stats {:?}",
        srv.ipc().stats()
    );
    assert!(worst < Duration::from_secs(2), "worst round trip {worst:?}");
    assert!(
        total < Duration::from_secs(10),
        "200 round trips took {total:?}"
    );
    assert!(
        flood_lines > 1000,
        "the flood was real: {flood_lines} lines"
    );
    // 64 queued lines + one 64 KiB receive buffer + the kernel's socket buffers: a few MiB at
    // most, never unbounded.
    assert!(
        noread_bytes < 16 << 20,
        "an unread agent pushed {noread_bytes} bytes"
    );
    assert_eq!(
        noread_later, noread_bytes,
        "the unread agent's writer is blocked"
    );
    srv.ipc().forget("t/flood");
    srv.ipc().forget("t/noread");
    for t in threads {
        t.join().expect("thread");
    }
}

#[test]
fn forget_unlinks_the_socket_and_closes_connections() {
    skip_unless_capable!();
    let Some(srv) = Server::start(Limits::default()) else {
        return;
    };
    let cg = TestCgroup::new("ipc-forget");
    let bed = agent_in(&cg, "gone");
    let dir = tempfile::tempdir().expect("tempdir");
    let path = sock_path(&dir, "gone");
    srv.ipc().listen(&bed.agent, &path).expect("listen");
    let mut child = bridge_in(&bed.agent.cgroup_dir, &path);
    let mut stdin = child.stdin.take().expect("stdin");
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    stdin.write_all(b"{\"id\":1}\n").expect("write");
    assert_eq!(read_line(&mut out), "{\"id\":1}\n");
    let paired = stream(srv.ipc().pair(&bed.agent).expect("pair"));
    srv.peer();
    srv.peer();
    assert_eq!(srv.ipc().stats().listeners, 1);

    srv.ipc().forget("t/gone");
    assert!(!path.exists(), "socket file unlinked when forget returns");
    // The bridge sees the socket close and exits 0 although its stdin is still open.
    let st = wait_exit(&mut child, 10);
    assert!(st.success(), "bridge exit {st}");
    let mut rest = Vec::new();
    (&paired)
        .read_to_end(&mut rest)
        .expect("paired end sees EOF");
    assert!(rest.is_empty());
    let err = UnixStream::connect(&path).expect_err("no socket any more");
    assert_eq!(err.kind(), std::io::ErrorKind::NotFound);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = srv.ipc().stats();
        if s.connections_open == 0 && s.listeners == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "not cleaned up: {s:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(stdin);
}

#[test]
fn connection_limit_refuses_the_extra_connection() {
    skip_unless_capable!();
    let Some(mut srv) = Server::start(Limits {
        max_conns_per_agent: 2,
        ..Limits::default()
    }) else {
        return;
    };
    let cg = TestCgroup::new("ipc-limit");
    let bed = agent_in(&cg, "lim");
    let dir = tempfile::tempdir().expect("tempdir");
    let path = sock_path(&dir, "lim");
    srv.ipc().listen(&bed.agent, &path).expect("listen");
    let a = stream(srv.ipc().pair(&bed.agent).expect("pair 1"));
    let b = stream(srv.ipc().pair(&bed.agent).expect("pair 2"));
    srv.peer();
    srv.peer();
    // The third, from a process inside the agent's cgroup, is over the limit.
    let mut child = bridge_in(&bed.agent.cgroup_dir, &path);
    let mut out = Vec::new();
    child
        .stdout
        .take()
        .expect("stdout")
        .read_to_end(&mut out)
        .expect("read");
    assert!(out.is_empty());
    let r = srv.refusal();
    assert_eq!(r.pid, Some(child.id()));
    assert!(r.reason.contains("max_conns_per_agent"), "{}", r.reason);
    drop(child.stdin.take());
    wait_exit(&mut child, 10);
    // The first two still work; closing one makes room.
    let mut ra = BufReader::new(a.try_clone().expect("clone"));
    (&a).write_all(b"{\"still\":1}\n").expect("write");
    assert_eq!(read_line(&mut ra), "{\"still\":1}\n");
    drop(ra);
    drop(a);
    srv.closed
        .recv_timeout(Duration::from_secs(10))
        .expect("closed");
    let deadline = Instant::now() + Duration::from_secs(10);
    while srv.ipc().stats().connections_open != 1 {
        assert!(Instant::now() < deadline, "slot not freed");
        std::thread::sleep(Duration::from_millis(20));
    }
    let c = stream(srv.ipc().pair(&bed.agent).expect("pair 3"));
    let mut rc = BufReader::new(c.try_clone().expect("clone"));
    (&c).write_all(b"{\"third\":1}\n").expect("write");
    assert_eq!(read_line(&mut rc), "{\"third\":1}\n");
    drop(b);
}

#[test]
fn shutdown_closes_everything_and_unlinks() {
    skip_unless_capable!();
    let Some(mut srv) = Server::start(Limits::default()) else {
        return;
    };
    let cg = TestCgroup::new("ipc-shutdown");
    let bed = agent_in(&cg, "s");
    let dir = tempfile::tempdir().expect("tempdir");
    let path = sock_path(&dir, "s");
    srv.ipc().listen(&bed.agent, &path).expect("listen");
    let p = stream(srv.ipc().pair(&bed.agent).expect("pair"));
    srv.peer();
    let ipc = srv.ipc.take().expect("server");
    drop(ipc);
    assert!(!path.exists(), "socket unlinked at shutdown");
    let mut rest = Vec::new();
    (&p).read_to_end(&mut rest).expect("EOF after shutdown");
    assert!(rest.is_empty());
}

#[test]
fn bridge_copies_lines_both_ways_and_half_closes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("b.sock");
    let l = UnixListener::bind(&path).expect("bind");
    let server = std::thread::spawn(move || {
        let (s, _) = l.accept().expect("accept");
        let mut w = s.try_clone().expect("clone");
        let mut n = 0;
        for line in BufReader::new(s).lines() {
            let line = line.expect("line");
            writeln!(w, "{{\"echo\":{line}}}").expect("echo");
            n += 1;
        }
        // stdin EOF reached us as EOF; we can still answer.
        writeln!(w, "{{\"bye\":{n}}}").expect("bye");
    });
    let mut child = Command::new(common::bridge_bin())
        .arg("--socket")
        .arg(&path)
        .env_remove("AGENTOS_SOCKET")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn bridge");
    let mut stdin = child.stdin.take().expect("stdin");
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    stdin.write_all(b"1\n").expect("write");
    // Flushed per line: the answer comes before stdin closes.
    assert_eq!(read_line(&mut out), "{\"echo\":1}\n");
    stdin.write_all(b"2\n3\n").expect("write");
    drop(stdin);
    let mut rest = String::new();
    out.read_to_string(&mut rest).expect("rest");
    assert_eq!(rest, "{\"echo\":2}\n{\"echo\":3}\n{\"bye\":3}\n");
    assert!(wait_exit(&mut child, 10).success());
    server.join().expect("server");
}

#[test]
fn bridge_uses_an_inherited_fd() {
    let (ours, theirs) = UnixStream::pair().expect("socketpair");
    let raw = theirs.as_raw_fd();
    let mut cmd = Command::new(common::bridge_bin());
    cmd.env_remove("AGENTOS_SOCKET")
        .env("AGENTOS_SOCKET_FD", "5")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    // SAFETY: dup2 is async-signal-safe; it runs in the forked child before exec and makes fd 5
    // (without close-on-exec) a copy of the socketpair end.
    unsafe {
        cmd.pre_exec(move || {
            if libc::dup2(raw, 5) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().expect("spawn");
    drop(theirs);
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(b"{\"up\":1}\n").expect("write");
    let mut r = BufReader::new(ours.try_clone().expect("clone"));
    assert_eq!(read_line(&mut r), "{\"up\":1}\n");
    (&ours).write_all(b"{\"down\":1}\n").expect("write");
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    assert_eq!(read_line(&mut out), "{\"down\":1}\n");
    drop(ours);
    drop(r);
    assert!(wait_exit(&mut child, 10).success());
}

#[test]
fn bridge_without_a_socket_says_what_to_do() {
    let out = Command::new(common::bridge_bin())
        .env_remove("AGENTOS_SOCKET")
        .env_remove("AGENTOS_SOCKET_FD")
        .stdin(Stdio::null())
        .output()
        .expect("run bridge");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("AGENTOS_SOCKET is not set"), "{err}");
    assert!(err.contains("--socket"), "{err}");
    let out = Command::new(common::bridge_bin())
        .arg("--socket")
        .arg("/nonexistent/agentos.sock")
        .stdin(Stdio::null())
        .output()
        .expect("run bridge");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/agentos.sock"), "{err}");
}

#[test]
fn listen_refuses_to_replace_a_non_socket() {
    let Some(srv) = Server::start(Limits::default()) else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("file.sock");
    std::fs::write(&path, "precious").expect("write");
    let err = srv
        .ipc()
        .listen(&paired_agent("f"), &path)
        .expect_err("must not replace a file");
    assert!(matches!(err, IpcError::NotASocket { .. }), "{err}");
    assert_eq!(std::fs::read_to_string(&path).expect("read"), "precious");
    let long = dir.path().join("x".repeat(120));
    let err = srv
        .ipc()
        .listen(&paired_agent("f"), &long)
        .expect_err("too long");
    assert!(matches!(err, IpcError::PathTooLong { .. }), "{err}");
}

#[test]
fn many_connections_survive_forget_under_traffic() {
    let Some(srv) = Server::start(Limits::default()) else {
        return;
    };
    let mut threads = Vec::new();
    for a in 0..6 {
        for c in 0..4 {
            let s = stream(
                srv.ipc()
                    .pair(&paired_agent(&format!("m{a}")))
                    .expect("pair"),
            );
            threads.push(std::thread::spawn(move || {
                let mut r = BufReader::new(s.try_clone().expect("clone"));
                let mut done = 0;
                for i in 0..300 {
                    let msg = format!("{{\"a\":{a},\"c\":{c},\"i\":{i}}}\n");
                    if (&s).write_all(msg.as_bytes()).is_err() {
                        break;
                    }
                    let mut l = String::new();
                    match r.read_line(&mut l) {
                        Ok(0) | Err(_) => break,
                        Ok(_) => assert_eq!(l, msg, "echo on agent m{a} conn {c}"),
                    }
                    done += 1;
                }
                (a, done)
            }));
        }
    }
    std::thread::sleep(Duration::from_millis(50));
    srv.ipc().forget("t/m0");
    let mut full = 0;
    for t in threads {
        let (a, done) = t.join().expect("client thread");
        if a != 0 {
            assert_eq!(done, 300, "agent m{a} was cut short");
            full += 1;
        }
    }
    assert_eq!(full, 20);
    for a in 1..6 {
        srv.ipc().forget(&format!("t/m{a}"));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while srv.ipc().stats().connections_open != 0 {
        assert!(Instant::now() < deadline, "{:?}", srv.ipc().stats());
        std::thread::sleep(Duration::from_millis(20));
    }
}
