//! Whether a throw-away server is up: the one answering on its port is the process the test
//! started. Used by the shared harness and by tests/without_fred.rs, which cannot use the
//! harness (it talks to servers through fred).

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpStream};
use std::time::Duration;

/// Whether the server answering on `port` is the process `pid`: up, and not another test's
/// server that took the port between the OS calling it free and this one's bind (which then
/// exits, perhaps only after the other has answered). Two cargo passes run at once in CI, so
/// the window is not only a theory. A server still loading its data answers PING with
/// `-LOADING` (INFO it answers): not up yet. A server with a password refuses both before
/// `AUTH`: it is up, and taken as ours.
pub fn answers_as(port: u16, pid: u32) -> bool {
    let addr = SocketAddrV4::new(Ipv4Addr::LOCALHOST, port);
    let Ok(mut stream) = TcpStream::connect_timeout(&addr.into(), Duration::from_millis(200))
    else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    if stream.write_all(b"PING\r\nINFO server\r\n").is_err() {
        return false;
    }
    let mut pong = [0u8; 7];
    if stream.read_exact(&mut pong).is_err() {
        return false;
    }
    match &pong {
        b"+PONG\r\n" => {}
        b"-NOAUTH" => return true,
        _ => return false,
    }
    // A bulk string (`$<length>`, then lines such as `process_id:<pid>`), or an error line.
    let mut reply = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&reply);
        if text.starts_with('-') {
            return false;
        }
        if let Some((_, rest)) = text.split_once("process_id:") {
            if let Some((id, _)) = rest.split_once("\r\n") {
                return id.parse::<u32>() == Ok(pid);
            }
        }
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => return false,
            Ok(read) => reply.extend_from_slice(&chunk[..read]),
        }
    }
}
