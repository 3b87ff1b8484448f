//! The counter family: Redisson's integer strings ([`Semaphore`](crate::Semaphore)'s permits,
//! [`PermitSemaphore`](crate::PermitSemaphore)'s with their leases,
//! [`CountDownLatch`](crate::CountDownLatch)'s count), and what they share. Their scripts
//! start with `lua/counter.lua` (see `lua::counter_script`).

use crate::client::LockClient;
use crate::engine;
use crate::error::{Error, Result};

pub(crate) mod latch;
pub(crate) mod permit_semaphore;
pub(crate) mod semaphore;

/// The integer string at `name`: 0 when missing, `WrongType` when it is no integer.
pub(crate) async fn read_counter(client: &LockClient, name: &str) -> Result<i64> {
    let core = client.engine().core();
    core.ensure_open()?;
    engine::check_name(name)?;
    let value: Option<String> = core
        .redis()
        .get(name)
        .await
        .map_err(|source| client.engine().redis_error(name, None, source))?;
    match value {
        None => Ok(0),
        Some(text) => text.parse().map_err(|_| Error::WrongType {
            lock: name.to_owned(),
            key: name.to_owned(),
        }),
    }
}

/// Fails with `InvalidArgument` for no permits, before anything is sent.
pub(crate) fn check_permits(name: &str, permits: u32) -> Result<()> {
    if permits == 0 {
        return Err(Error::InvalidArgument(format!(
            "semaphore {name:?}: take or add at least 1 permit"
        )));
    }
    Ok(())
}
