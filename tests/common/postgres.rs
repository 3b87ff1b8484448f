//! A throw-away PostgreSQL server on a free loopback port, for the fencing tests.

#![allow(unused_imports)]

use super::*;
use std::future::Future;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fred::prelude::*;

/// A throw-away PostgreSQL server on a free loopback port: `initdb` into a temporary directory
/// (as the `postgres` user when the tests run as root, which PostgreSQL refuses), `postgres`
/// with fsync off, trust authentication for the `postgres` role. Killed and deleted on drop.
pub struct PostgresServer {
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl PostgresServer {
    /// Starts a server and waits until it says it is ready (see [`ready_as`]).
    pub fn start() -> PostgresServer {
        PostgresServer::start_with(free_port)
    }

    /// [`start`](Self::start) on the ports `pick` gives, one per try.
    pub fn start_with(pick: impl Fn() -> u16) -> PostgresServer {
        let bin = postgres_bin();
        let dir = std::env::temp_dir().join(format!(
            "fredlock-pg-{}-{}",
            std::process::id(),
            NEXT_DIR.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("create the PostgreSQL directory");
        let owner = postgres_owner();
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).expect("chown the directory");
        }
        let data = dir.join("data");
        let mut initdb = Command::new(bin.join("initdb"));
        initdb
            .current_dir(&dir)
            .arg("-D")
            .arg(&data)
            .args(["-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync"])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        as_owner(&mut initdb, owner);
        let status = initdb
            .status()
            .expect("run initdb (is PostgreSQL installed?)");
        assert!(status.success(), "initdb failed in {}", data.display());
        let mut server = PostgresServer {
            port: 0,
            dir,
            child: None,
        };
        for _ in 0..10 {
            server.port = pick();
            let mut postgres = Command::new(bin.join("postgres"));
            postgres
                .current_dir(&server.dir)
                .arg("-D")
                .arg(&data)
                .args(["-p", &server.port.to_string()])
                .args(["-c", "listen_addresses=127.0.0.1"])
                .arg("-c")
                .arg(format!("unix_socket_directories={}", server.dir.display()))
                .args(["-c", "fsync=off", "-c", "full_page_writes=off"])
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            as_owner(&mut postgres, owner);
            let mut child = postgres.spawn().expect("start postgres");
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    break; // exited: most likely the port was taken
                }
                // Its own pid file, not an open port: when the port was taken between the
                // pick and the bind, whoever took it answers there while this child exits.
                if ready_as(&data, child.id()) {
                    server.child = Some(child);
                    return server;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("could not start postgres");
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The connection string of its `postgres` database, as `DATABASE_URL` takes it.
    pub fn conninfo(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres connect_timeout=10",
            self.port
        )
    }

    /// A connection to the `postgres` database; its driver task runs until the server goes.
    pub async fn client(&self) -> tokio_postgres::Client {
        let config = self.conninfo();
        // The server may still be starting up behind its open port.
        for _ in 0..100 {
            if let Ok((client, connection)) =
                tokio_postgres::connect(&config, tokio_postgres::NoTls).await
            {
                tokio::spawn(connection);
                return client;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("could not connect to postgres on port {}", self.port);
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Whether the server of `data` is process `pid` and has said it is ready for connections in
/// its `postmaster.pid` (line 1 its pid, line 8 its status), which it writes once it listens on
/// its port.
fn ready_as(data: &std::path::Path, pid: u32) -> bool {
    let Ok(text) = std::fs::read_to_string(data.join("postmaster.pid")) else {
        return false;
    };
    let lines: Vec<&str> = text.lines().collect();
    lines.first().map(|line| line.trim()) == Some(pid.to_string().as_str())
        && lines.get(7).map(|line| line.trim()) == Some("ready")
}

/// Where PostgreSQL's server programs are: on PATH, else Debian's `/usr/lib/postgresql/<v>/bin`
/// (the newest).
fn postgres_bin() -> PathBuf {
    if let Ok(path) = std::env::var("PATH") {
        for dir in std::env::split_paths(&path) {
            if dir.join("initdb").is_file() && dir.join("postgres").is_file() {
                return dir;
            }
        }
    }
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|entries| {
            entries
                .filter_map(|entry| entry.ok().map(|entry| entry.path().join("bin")))
                .filter(|bin| bin.join("initdb").is_file())
                .collect()
        })
        .unwrap_or_default();
    versions.sort_by_key(|bin| {
        bin.parent()
            .and_then(|version| version.file_name())
            .and_then(|name| name.to_str())
            .and_then(|name| name.parse::<u32>().ok())
            .unwrap_or(0)
    });
    versions.pop().expect(
        "PostgreSQL's initdb is neither on PATH nor in /usr/lib/postgresql (Debian: postgresql)",
    )
}

/// The `postgres` user's uid and gid when the tests run as root (PostgreSQL refuses root).
fn postgres_owner() -> Option<(u32, u32)> {
    let id = |flag: &str| -> Option<u32> {
        let out = Command::new("id").args([flag, "postgres"]).output().ok()?;
        String::from_utf8(out.stdout).ok()?.trim().parse().ok()
    };
    let me = Command::new("id").arg("-u").output().ok()?;
    if String::from_utf8_lossy(&me.stdout).trim() != "0" {
        return None;
    }
    Some((
        id("-u").expect("a postgres user to run PostgreSQL as"),
        id("-g")?,
    ))
}

fn as_owner(command: &mut Command, owner: Option<(u32, u32)>) {
    use std::os::unix::process::CommandExt;
    if let Some((uid, gid)) = owner {
        command.uid(uid).gid(gid);
    }
}
