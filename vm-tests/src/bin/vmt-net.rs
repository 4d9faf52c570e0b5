//! Network attempts for the VM tests: `vmt-net UDP_PORT OTHER_UDP_PORT TCP_PORT` tries each
//! destination once from inside an agent and prints `NAME ok` or `NAME err ERRNO` per attempt,
//! then `done`, then sleeps (so the test reads the agent while it runs).

use std::net::{TcpStream, UdpSocket};
use std::time::Duration;

fn errno_name(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(1) => "EPERM".into(),
        Some(13) => "EACCES".into(),
        Some(111) => "ECONNREFUSED".into(),
        Some(n) => format!("errno{n}"),
        None => e.to_string(),
    }
}

fn attempt(name: &str, r: std::io::Result<()>) {
    match r {
        Ok(()) => println!("{name} ok"),
        Err(e) => println!("{name} err {}", errno_name(&e)),
    }
}

fn udp(bind: &str, to: (&str, u16)) -> std::io::Result<()> {
    UdpSocket::bind(bind)?
        .send_to(b"agent datagram", to)
        .map(|_| ())
}

fn udp_connect(to: (&str, u16)) -> std::io::Result<()> {
    UdpSocket::bind("0.0.0.0:0")?.connect(to)
}

fn tcp(to: &str) -> std::io::Result<()> {
    let addr = to.parse().map_err(std::io::Error::other)?;
    TcpStream::connect_timeout(&addr, Duration::from_secs(3)).map(|_| ())
}

fn main() {
    let a: Vec<u16> = std::env::args()
        .skip(1)
        .map(|s| s.parse().expect("ports"))
        .collect();
    let (up, up2, tp) = (a[0], a[1], a[2]);
    attempt("udp-granted", udp("0.0.0.0:0", ("127.0.0.1", up)));
    attempt("udp-other-host", udp("0.0.0.0:0", ("127.0.0.2", up)));
    attempt("udp-other-port", udp("0.0.0.0:0", ("127.0.0.1", up2)));
    attempt("udp-connect-other-host", udp_connect(("127.0.0.3", up)));
    attempt("tcp-granted", tcp(&format!("127.0.0.1:{tp}")));
    attempt("tcp-other-host", tcp(&format!("127.0.0.2:{tp}")));
    println!("done");
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}
