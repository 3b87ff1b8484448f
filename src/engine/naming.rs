//! A client's name, for people: given on the builder, sent as `CLIENT SETNAME <name>@<client
//! uuid>` on each command connection (again after every reconnect), so that `CLIENT LIST`, an
//! inspection, the `fredlock` command and the lost-lock warnings say which service holds a lock
//! beside the owner field, whose layout stays Redisson's.
//!
//! The uuid after the last `@` ties a connection to the owner fields of its client; the name
//! before it is what an operator reads.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

use dashmap::DashMap;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::engine::Connection;
use crate::error::{Error, RedisError, Result};

/// The longest name taken: a label, not a document (every connection of the client carries it).
pub(crate) const MAX_NAME: usize = 64;

/// The names of this process's clients by id, for the warnings of code that holds an owner
/// field and nothing else (a hold that finds itself lost). Read only when such a warning is
/// written.
static NAMES: LazyLock<DashMap<Uuid, Arc<str>>> = LazyLock::new(DashMap::new);

/// Refuses a name `CLIENT SETNAME` would refuse (spaces, newlines, anything outside printable
/// ASCII), an empty one, and one over [`MAX_NAME`].
pub(crate) fn check(name: &str) -> Result<()> {
    if name.is_empty() || name.len() > MAX_NAME || !name.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(Error::InvalidArgument(format!(
            "client_name {name:?}: 1 to {MAX_NAME} printable ASCII characters without spaces, \
             as CLIENT SETNAME takes (say \"billing-7\")"
        )));
    }
    Ok(())
}

/// The connection name of client `id` named `name`.
fn connection_name(name: &str, id: Uuid) -> String {
    format!("{name}@{}", id.hyphenated())
}

/// The client name and id in a connection name this module set; `None` for any other.
fn parse(connection: &str) -> Option<(&str, Uuid)> {
    let (name, id) = connection.rsplit_once('@')?;
    Some((name, Uuid::parse_str(id).ok()?))
}

/// The name of the client of owner field `field` in this process, for warnings that carry only
/// the field (a hold that finds itself lost); `None` for a client without one.
pub(crate) fn of_field(field: &str) -> Option<Arc<str>> {
    let id = Uuid::parse_str(field.split(':').next()?).ok()?;
    NAMES.get(&id).map(|name| name.clone())
}

/// Client `id`'s name, kept for its warnings until [`forget`] is called.
pub(crate) fn remember(id: Uuid, name: &str) {
    NAMES.insert(id, name.into());
}

/// Drops client `id`'s name (the client is gone).
pub(crate) fn forget(id: Uuid) {
    NAMES.remove(&id);
}

/// Names every connection of `clients` (each master's, on a cluster).
pub(crate) async fn name_connections(
    clients: &[Connection],
    name: &str,
    id: Uuid,
) -> std::result::Result<(), RedisError> {
    let connection = connection_name(name, id);
    for client in clients {
        if client.is_clustered() {
            for server in client.connected_to() {
                client.on_node(server).set_name(&connection).await?;
            }
        } else {
            client.set_name(&connection).await?;
        }
    }
    Ok(())
}

/// Names the connections of `clients` again after each reconnect (a new connection has no
/// name), until `shutdown`.
pub(crate) fn follow(
    clients: Vec<Connection>,
    name: Arc<str>,
    id: Uuid,
    shutdown: CancellationToken,
) -> Vec<JoinHandle<()>> {
    clients
        .into_iter()
        .map(|client| {
            let name = name.clone();
            let shutdown = shutdown.clone();
            let mut reconnects = client.reconnects();
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        reconnected = reconnects.recv() => {
                            if matches!(reconnected, Err(tokio::sync::broadcast::error::RecvError::Closed)) {
                                return;
                            }
                        }
                    }
                    let named = name_connections(std::slice::from_ref(&client), &name, id).await;
                    if let Err(error) = named {
                        tracing::warn!(
                            client = %name, %error,
                            "could not name a connection after a reconnect; inspections will not \
                             show this client's name"
                        );
                    }
                }
            })
        })
        .collect()
}

/// The names of the clients connected to `redis` (one node's `CLIENT LIST`), by id; empty when
/// the server refuses `CLIENT LIST` (an ACL without it).
pub(crate) async fn connected(redis: &Connection) -> HashMap<Uuid, String> {
    let list = if redis.is_clustered() {
        let Some(server) = redis.connected_to().into_iter().next() else {
            return HashMap::new();
        };
        redis.on_node(server).client_list().await
    } else {
        redis.client_list().await
    };
    let Ok(list) = list else {
        return HashMap::new();
    };
    list.lines()
        .filter_map(|line| {
            let field = line
                .split(' ')
                .find_map(|field| field.strip_prefix("name="))?;
            let (name, id) = parse(field)?;
            Some((id, name.to_owned()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_and_read_back() {
        for bad in [
            "",
            "has space",
            "new\nline",
            "tab\t",
            "é",
            &"x".repeat(MAX_NAME + 1),
        ] {
            assert!(check(bad).is_err(), "{bad:?}");
        }
        for good in ["billing-7", "a", "pod@eu-west:3", &"x".repeat(MAX_NAME)] {
            check(good).unwrap();
        }
        let id = Uuid::new_v4();
        let connection = connection_name("pod@eu-west:3", id);
        assert_eq!(parse(&connection), Some(("pod@eu-west:3", id)));
        assert_eq!(parse("fred-abc123"), None);
        assert_eq!(parse("someone@not-a-uuid"), None);

        remember(id, "billing-7");
        let field = format!("{}:12", id.hyphenated());
        assert_eq!(of_field(&field).as_deref(), Some("billing-7"));
        forget(id);
        assert_eq!(of_field(&field), None);
    }
}
