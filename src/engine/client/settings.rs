//! What a client is configured with in a build without fred: the servers and the credentials,
//! read from a URL as fred reads one (the same schemes and the same fields), so that the public
//! builder is written once for either build; and in every build the reconnect policy, the
//! crate's own (converted to fred's at the seam), so that turning fred on beside redis-rs
//! changes no type of the public API.
//!
//! A build with fred uses the configuration only in its tests, which hold it to fred's reading.
#![cfg_attr(feature = "fred", allow(dead_code))]

use std::fmt;

use crate::engine::Server;

/// Where a client's servers are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ServerConfig {
    Centralized {
        server: Server,
    },
    Clustered {
        hosts: Vec<Server>,
    },
    Sentinel {
        hosts: Vec<Server>,
        service_name: String,
        username: Option<String>,
        password: Option<String>,
    },
}

impl ServerConfig {
    pub(crate) fn new_centralized(host: impl Into<String>, port: u16) -> ServerConfig {
        ServerConfig::Centralized {
            server: Server::new(host.into(), port),
        }
    }

    pub(crate) fn new_sentinel(hosts: Vec<(String, u16)>, service_name: String) -> ServerConfig {
        ServerConfig::Sentinel {
            hosts: hosts
                .into_iter()
                .map(|(host, port)| Server::new(host, port))
                .collect(),
            service_name,
            username: None,
            password: None,
        }
    }

    pub(crate) fn is_clustered(&self) -> bool {
        matches!(self, ServerConfig::Clustered { .. })
    }

    pub(crate) fn hosts(&self) -> Vec<Server> {
        match self {
            ServerConfig::Centralized { server } => vec![server.clone()],
            ServerConfig::Clustered { hosts } | ServerConfig::Sentinel { hosts, .. } => {
                hosts.clone()
            }
        }
    }
}

impl Default for ServerConfig {
    fn default() -> ServerConfig {
        ServerConfig::new_centralized("127.0.0.1", 6379)
    }
}

/// A client's configuration.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Config {
    pub(crate) server: ServerConfig,
    pub(crate) username: Option<String>,
    pub(crate) password: Option<String>,
    pub(crate) database: Option<u8>,
    pub(crate) tls: bool,
}

/// Why a URL could not be read.
#[derive(Debug)]
pub(crate) struct UrlError(String);

impl UrlError {
    pub(crate) fn details(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for UrlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Config {
    /// Whether the servers speak TLS (a `rediss://` or `valkeys://` URL).
    pub(crate) fn uses_tls(&self) -> bool {
        self.tls
    }

    /// Reads `scheme://[user[:password]@]host[:port][/database][?node=host:port&..]`, with the
    /// schemes fred reads (`redis`, `rediss`, `valkey`, `valkeys`, each also `-cluster` and
    /// `-sentinel`; `sentinelServiceName`, `sentinelUsername` and `sentinelPassword` in the
    /// query of a Sentinel URL).
    pub(crate) fn from_url(url: &str) -> Result<Config, UrlError> {
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| UrlError("no scheme".into()))?;
        let scheme = scheme.to_ascii_lowercase();
        if scheme.ends_with("+unix") {
            return Err(UrlError(
                "a Unix socket is not supported without fred".into(),
            ));
        }
        let (base, kind) = match (
            scheme.strip_suffix("-cluster"),
            scheme.strip_suffix("-sentinel"),
        ) {
            (Some(base), _) => (base, Kind::Cluster),
            (_, Some(base)) => (base, Kind::Sentinel),
            _ => (scheme.as_str(), Kind::Single),
        };
        let tls = matches!(base, "rediss" | "valkeys");
        let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let (login, address) = match authority.rsplit_once('@') {
            Some((login, address)) => (Some(login), address),
            None => (None, authority),
        };
        let (username, password) = match login {
            None => (None, None),
            Some(login) => {
                let (user, password) = match login.split_once(':') {
                    Some((user, password)) => (user, Some(password)),
                    None => (login, None),
                };
                let user = decoded(user)?;
                let password = password.map(decoded).transpose()?;
                ((!user.is_empty()).then_some(user), password)
            }
        };
        let first = address_of(address)?;
        let database = match path.trim_end_matches('/') {
            "" => None,
            number => Some(
                number
                    .parse::<u8>()
                    .map_err(|_| UrlError(format!("database {number:?} is not a number")))?,
            ),
        };
        let mut nodes = vec![first];
        let mut service_name = None;
        let mut sentinel_username = None;
        let mut sentinel_password = None;
        for pair in query.split('&').filter(|pair| !pair.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let value = decoded(value)?;
            match name {
                "node" => nodes.push(address_of(&value)?),
                "sentinelServiceName" => service_name = Some(value),
                "sentinelUsername" => sentinel_username = Some(value),
                "sentinelPassword" => sentinel_password = Some(value),
                _ => {}
            }
        }
        let server = match kind {
            Kind::Single => ServerConfig::Centralized {
                server: nodes.swap_remove(0),
            },
            Kind::Cluster => ServerConfig::Clustered { hosts: nodes },
            Kind::Sentinel => ServerConfig::Sentinel {
                hosts: nodes,
                service_name: service_name.ok_or_else(|| {
                    UrlError("a Sentinel URL needs ?sentinelServiceName=..".into())
                })?,
                username: sentinel_username,
                password: sentinel_password,
            },
        };
        Ok(Config {
            server,
            username,
            password,
            database,
            tls,
        })
    }
}

enum Kind {
    Single,
    Cluster,
    Sentinel,
}

/// `host[:port]` or `[v6 address][:port]` (the host keeps its brackets, as fred keeps them);
/// the port is 6379 when not given.
fn address_of(text: &str) -> Result<Server, UrlError> {
    let (host, port) = match text.find(']') {
        Some(close) if text.starts_with('[') => {
            let (host, rest) = text.split_at(close + 1);
            (host, rest.strip_prefix(':'))
        }
        None if text.starts_with('[') => {
            return Err(UrlError(format!("{text:?}: an unclosed [")));
        }
        _ => match text.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (text, None),
        },
    };
    if host.is_empty() {
        return Err(UrlError(format!("{text:?} has no host")));
    }
    let port = match port {
        None | Some("") => 6379,
        Some(port) => port
            .parse()
            .map_err(|_| UrlError(format!("port {port:?} is not a number")))?,
    };
    Ok(Server::new(host.to_owned(), port))
}

/// Undoes a URL's percent-encoding.
fn decoded(text: &str) -> Result<String, UrlError> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let byte = text
                .get(i + 1..i + 3)
                .and_then(|hex| u8::from_str_radix(hex, 16).ok())
                .ok_or_else(|| UrlError("a % not followed by two hex digits".into()))?;
            out.push(byte);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| UrlError("a percent-encoded part is not UTF-8".into()))
}

/// How a connection is made again after it drops: how many times, and how long to wait before
/// each try (in milliseconds), as fred's policy of the same name counts them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReconnectPolicy {
    pub(crate) shape: Shape,
    /// At most this many tries in a row (0: without end).
    pub(crate) max_attempts: u32,
    attempts: u32,
    /// Up to this many milliseconds added to each wait at random, so that clients that lost
    /// the same server do not all come back at once.
    pub(crate) jitter: u32,
}

/// How the waits between tries grow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Shape {
    Constant {
        delay: u32,
    },
    Linear {
        max_delay: u32,
        delay: u32,
    },
    Exponential {
        min_delay: u32,
        max_delay: u32,
        base: u32,
    },
}

impl ReconnectPolicy {
    /// The same `delay` (ms) before each of at most `max_attempts` tries (0: without end).
    pub fn new_constant(max_attempts: u32, delay: u32) -> ReconnectPolicy {
        ReconnectPolicy::with(Shape::Constant { delay }, max_attempts)
    }

    /// `delay`, `2 * delay`, .. (ms), at most `max_delay`.
    pub fn new_linear(max_attempts: u32, max_delay: u32, delay: u32) -> ReconnectPolicy {
        ReconnectPolicy::with(Shape::Linear { max_delay, delay }, max_attempts)
    }

    /// `min_delay * base^attempt` (ms), at most `max_delay`.
    pub fn new_exponential(
        max_attempts: u32,
        min_delay: u32,
        max_delay: u32,
        base: u32,
    ) -> ReconnectPolicy {
        ReconnectPolicy::with(
            Shape::Exponential {
                min_delay,
                max_delay,
                base,
            },
            max_attempts,
        )
    }

    fn with(shape: Shape, max_attempts: u32) -> ReconnectPolicy {
        ReconnectPolicy {
            shape,
            max_attempts,
            attempts: 0,
            jitter: 100,
        }
    }

    /// Up to `jitter` milliseconds (default 100) added to each wait at random.
    pub fn set_jitter(&mut self, jitter: u32) {
        self.jitter = jitter;
    }

    /// The wait (ms) before the next try, or `None` once the tries are used up.
    pub fn next_delay(&mut self) -> Option<u64> {
        if self.max_attempts > 0 && self.attempts >= self.max_attempts {
            return None;
        }
        self.attempts = self.attempts.saturating_add(1);
        let jittered = |delay: u64| match self.jitter {
            0 => delay,
            jitter => delay.saturating_add(rand::Rng::gen_range(
                &mut rand::thread_rng(),
                0..u64::from(jitter),
            )),
        };
        Some(match self.shape {
            Shape::Constant { delay } => jittered(u64::from(delay)),
            Shape::Linear { max_delay, delay } => {
                jittered(u64::from(delay).saturating_mul(u64::from(self.attempts)))
                    .min(u64::from(max_delay))
            }
            Shape::Exponential {
                min_delay,
                max_delay,
                base,
            } => jittered(
                u64::from(base)
                    .saturating_pow(self.attempts - 1)
                    .saturating_mul(u64::from(min_delay)),
            )
            .min(u64::from(max_delay)),
        })
    }
}

#[cfg(test)]
#[cfg(feature = "fred")]
mod tests {
    //! Against fred's reading of the same URLs and policies, where fred is compiled in.
    use super::*;

    #[test]
    fn urls_read_as_fred_reads_them() {
        for url in [
            "redis://127.0.0.1:6379",
            "redis://h",
            "redis://:secret@h:7000/3",
            "redis://app:p%40ss@h:7000",
            "valkey://app@10.0.0.1:6380/",
            "redis://[::1]:6390",
            "redis-cluster://h1:30001?node=h2:30002&node=h3:30003",
            "redis-sentinel://s1:26379/2?sentinelServiceName=locks&node=s2:26380&sentinelPassword=x",
        ] {
            let ours = Config::from_url(url).unwrap_or_else(|error| panic!("{url}: {error}"));
            let fred = fred::types::config::Config::from_url(url).expect(url);
            assert_eq!(ours.username, fred.username, "{url}");
            assert_eq!(ours.password, fred.password, "{url}");
            assert_eq!(ours.database, fred.database, "{url}");
            assert_eq!(ours.server.is_clustered(), fred.server.is_clustered(), "{url}");
            // The same hosts, in whatever order.
            let hosts = |mut hosts: Vec<String>| {
                hosts.sort();
                hosts
            };
            assert_eq!(
                hosts(ours.server.hosts().iter().map(ToString::to_string).collect()),
                hosts(fred.server.hosts().iter().map(ToString::to_string).collect()),
                "{url}"
            );
            if let (
                ServerConfig::Sentinel {
                    service_name,
                    password,
                    ..
                },
                fred::types::config::ServerConfig::Sentinel {
                    service_name: theirs,
                    password: their_password,
                    ..
                },
            ) = (&ours.server, &fred.server)
            {
                assert_eq!(service_name, theirs);
                assert_eq!(password, their_password);
            }
        }
        assert!(Config::from_url("redis://h:port").is_err());
        assert!(Config::from_url("redis://h:1/db").is_err());
        assert!(Config::from_url("rediss://h:1").unwrap().uses_tls());
    }

    #[test]
    fn fred_policies_convert_into_the_crates_own_and_back() {
        use fred::types::config::ReconnectPolicy as Fred;
        for mut fred in [
            Fred::new_constant(3, 50),
            Fred::new_linear(0, 500, 100),
            Fred::new_exponential(4, 1, 100, 10),
        ] {
            fred.set_jitter(0);
            let mut ours = ReconnectPolicy::from(fred.clone());
            let mut back = crate::engine::client::fred_policy(&ours);
            assert_eq!(back, fred);
            for attempt in 0..8 {
                let theirs = fred.next_delay();
                assert_eq!(ours.next_delay(), theirs, "{ours:?}, attempt {attempt}");
                assert_eq!(back.next_delay(), theirs, "{ours:?}, attempt {attempt}");
            }
        }
        let mut jittered = Fred::new_constant(1, 10);
        jittered.set_jitter(7);
        assert_eq!(ReconnectPolicy::from(jittered).jitter, 7);
    }

    #[test]
    fn policies_wait_as_fred_s() {
        use fred::types::config::ReconnectPolicy as Fred;
        let pairs = [
            (
                ReconnectPolicy::new_constant(3, 50),
                Fred::new_constant(3, 50),
            ),
            (
                ReconnectPolicy::new_linear(0, 500, 100),
                Fred::new_linear(0, 500, 100),
            ),
            (
                ReconnectPolicy::new_exponential(0, 100, 2_000, 2),
                Fred::new_exponential(0, 100, 2_000, 2),
            ),
            (
                ReconnectPolicy::new_exponential(4, 1, 100, 10),
                Fred::new_exponential(4, 1, 100, 10),
            ),
        ];
        for (mut ours, mut fred) in pairs {
            ours.set_jitter(0);
            fred.set_jitter(0);
            for attempt in 0..8 {
                assert_eq!(
                    ours.next_delay(),
                    fred.next_delay(),
                    "{ours:?}, attempt {attempt}"
                );
            }
        }
    }
}
