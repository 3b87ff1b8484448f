//! Fencing tokens with PostgreSQL: a holder paused past its lease cannot overwrite the work of
//! the holder after it, because the database refuses writes carrying an older token.
//!
//! ```text
//! cargo run --example fencing --features postgres
//! ```
//!
//! Uses the PostgreSQL at `DATABASE_URL` (default `host=127.0.0.1 user=postgres
//! dbname=postgres`), where it creates and drops a table `fencing_example`, and the Redis at
//! `REDIS_URL` when it is set, otherwise a throw-away `redis-server` (which must be on PATH).

use std::time::Duration;

use fredlock::LockClient;

mod throwaway;

use throwaway::redis_url;

/// The pattern: a write goes through only with a token greater than the last one it saw.
const FENCED_UPDATE: &str = "UPDATE fencing_example SET data = $1, last_fencing_token = $2 \
                             WHERE id = $3 AND last_fencing_token < $2";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (_server, url) = redis_url()?;
    let database = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "host=127.0.0.1 user=postgres dbname=postgres".into());
    let (db, connection) = tokio_postgres::connect(&database, tokio_postgres::NoTls)
        .await
        .map_err(|error| format!("PostgreSQL at {database:?}: {error} (set DATABASE_URL)"))?;
    tokio::spawn(connection);
    db.batch_execute(
        "DROP TABLE IF EXISTS fencing_example;
         CREATE TABLE fencing_example (id int PRIMARY KEY, data text NOT NULL,
                                       last_fencing_token bigint NOT NULL);
         INSERT INTO fencing_example VALUES (1, 'initial', 0);",
    )
    .await?;

    let client_a = LockClient::connect(&url).await?;
    let client_b = LockClient::connect(&url).await?;

    // A takes the lock for 300 ms, then stalls for 600 ms (a GC pause, a frozen VM).
    let a = client_a
        .fenced_lock("fencing:resource-1")
        .lock_with_lease(Duration::from_millis(300))
        .await?;
    println!("A holds the lock with token {}", a.token());
    tokio::time::sleep(Duration::from_millis(600)).await;

    // Meanwhile the lease ended and B took the lock, with a greater token, and wrote.
    let b = client_b.fenced_lock("fencing:resource-1").lock().await?;
    let rows = db
        .execute(FENCED_UPDATE, &[&"B's work", &(b.token() as i64), &1i32])
        .await?;
    println!("B (token {}) wrote: {rows} row(s) updated", b.token());

    // A resumes, unaware, and writes with its old token: refused.
    let rows = db
        .execute(
            FENCED_UPDATE,
            &[&"A's stale work", &(a.token() as i64), &1i32],
        )
        .await?;
    println!("A (token {}) wrote: {rows} row(s) updated", a.token());

    let row = db
        .query_one("SELECT data FROM fencing_example WHERE id = 1", &[])
        .await?;
    println!("the row holds {:?}", row.get::<_, String>(0));
    b.unlock().await?;
    drop(a);

    db.batch_execute("DROP TABLE fencing_example").await?;
    client_a.shutdown().await;
    client_b.shutdown().await;
    Ok(())
}
