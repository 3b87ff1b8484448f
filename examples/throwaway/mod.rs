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
        ThrowAwayRedis::start_with(None, &[])
    }

    /// Starts one with a config file (given first) and extra arguments, on a port the OS
    /// calls free, and waits until it answers. The port is free when asked, not always when the
    /// server binds it (another process may take it in between): a server that exits is
    /// started again on another port, and one counts as up only when the server answering on
    /// its port is this process (its `INFO` says so), not whoever took the port.
    pub fn start_with(
        config: Option<&std::path::Path>,
        extra: &[&str],
    ) -> std::io::Result<ThrowAwayRedis> {
        for _ in 0..5 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")?
                .local_addr()?
                .port();
            let mut command = std::process::Command::new("redis-server");
            if let Some(config) = config {
                command.arg(config);
            }
            let child = command
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no"])
                .args(extra)
                .stdout(std::process::Stdio::null())
                .spawn()?;
            let process_id = format!("process_id:{}\r\n", child.id());
            let mut server = ThrowAwayRedis {
                child,
                url: format!("redis://127.0.0.1:{port}"),
            };
            for _ in 0..400 {
                if let Ok(Some(_)) = server.child.try_wait() {
                    break; // most likely the port was taken: another one
                }
                if info(port, "server").contains(&process_id) {
                    return Ok(server);
                }
                std::thread::sleep(std::time::Duration::from_millis(25));
            }
            server.kill();
        }
        Err(std::io::Error::other(
            "redis-server did not start on a free port in five tries",
        ))
    }

    /// Its `redis://` URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Its port.
    #[allow(dead_code)] // only the sentinel example
    pub fn port(&self) -> u16 {
        self.url
            .rsplit(':')
            .next()
            .and_then(|port| port.parse().ok())
            .unwrap_or(0)
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

/// A throw-away Sentinel deployment: a master, two replicas and one sentinel watching them as
/// `service`, in a temporary directory that goes with it. Two replicas, so that the master a
/// failover promotes has a replica at once (the old master rejoins as one only seconds later).
#[allow(dead_code)] // only the sentinel example
pub struct ThrowAwaySentinel {
    pub master: ThrowAwayRedis,
    pub replicas: Vec<ThrowAwayRedis>,
    pub sentinel: ThrowAwayRedis,
    dir: std::path::PathBuf,
}

#[allow(dead_code)]
impl ThrowAwaySentinel {
    pub fn start(service: &str) -> std::io::Result<ThrowAwaySentinel> {
        let dir =
            std::env::temp_dir().join(format!("fredlock-example-sentinel-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        // A replica's first sync goes through a file: in this directory, not the working one.
        let dir_text = dir.to_string_lossy().into_owned();
        let in_dir = ["--dir", dir_text.as_str()];
        let master = ThrowAwayRedis::start_with(
            None,
            &[&in_dir[..], &["--repl-diskless-sync-delay", "0"]].concat(),
        )?;
        let master_port = master.port().to_string();
        let mut replicas = Vec::new();
        for file in ["replica-1.rdb", "replica-2.rdb"] {
            let replica = ThrowAwayRedis::start_with(
                None,
                &[
                    &in_dir[..],
                    &[
                        "--dbfilename",
                        file,
                        "--replicaof",
                        "127.0.0.1",
                        &master_port,
                    ],
                ]
                .concat(),
            )?;
            // A replica promoted before its first sync would come up empty; one that never
            // syncs would leave every lock waiting for it (replica sync): said, not waited on.
            let mut synced = false;
            for _ in 0..800 {
                if info(replica.port(), "replication").contains("master_link_status:up") {
                    synced = true;
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(25));
            }
            if !synced {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(std::io::Error::other(format!(
                    "the replica on port {} did not sync with the master within 20 s",
                    replica.port()
                )));
            }
            replicas.push(replica);
        }
        // A sentinel rewrites its config file, so it gets one of its own.
        let config = dir.join("sentinel.conf");
        std::fs::write(
            &config,
            format!(
                "sentinel monitor {service} 127.0.0.1 {master_port} 1\n\
                 sentinel down-after-milliseconds {service} 1000\n"
            ),
        )?;
        let sentinel = ThrowAwayRedis::start_with(Some(&config), &["--sentinel"])?;
        Ok(ThrowAwaySentinel {
            master,
            replicas,
            sentinel,
            dir,
        })
    }
}

impl Drop for ThrowAwaySentinel {
    fn drop(&mut self) {
        self.sentinel.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `INFO <section>` of the server on `port`, over a plain socket ("" when it does not answer).
fn info(port: u16, section: &str) -> String {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    let _ = stream.set_read_timeout(Some(std::time::Duration::from_millis(500)));
    if stream
        .write_all(format!("INFO {section}\r\n").as_bytes())
        .is_err()
    {
        return String::new();
    }
    let mut reply = [0u8; 4096];
    let read = stream.read(&mut reply).unwrap_or(0);
    String::from_utf8_lossy(&reply[..read]).into_owned()
}
