//! Scaffolding the examples share, not part of what they show: a throw-away `redis-server` from
//! PATH on a free loopback port, so that `cargo run --example ..` works without a Redis of your
//! own. In your project, connect to your Redis instead.

/// A throw-away `redis-server` (no persistence), killed when dropped.
pub struct ThrowAwayRedis {
    child: std::process::Child,
    url: String,
}

impl ThrowAwayRedis {
    /// Starts one and waits until it accepts connections.
    pub fn start() -> std::io::Result<ThrowAwayRedis> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let child = std::process::Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(std::process::Stdio::null())
            .spawn()?;
        let server = ThrowAwayRedis {
            child,
            url: format!("redis://127.0.0.1:{port}"),
        };
        for _ in 0..200 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(25));
        }
        Ok(server)
    }

    /// Its `redis://` URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Stops it now (as a crash would).
    #[allow(dead_code)] // only the redlock example kills servers on purpose
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ThrowAwayRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The Redis at `REDIS_URL`, or else a throw-away server, which lives as long as the returned
/// handle.
#[allow(dead_code)] // the redlock example starts its own five
pub fn redis_url() -> std::io::Result<(Option<ThrowAwayRedis>, String)> {
    if let Ok(url) = std::env::var("REDIS_URL") {
        return Ok((None, url));
    }
    let server = ThrowAwayRedis::start()?;
    let url = server.url().to_owned();
    println!("started a throw-away redis-server at {url}");
    Ok((Some(server), url))
}
