use fredlock::{Backend, LockClient};

// Cargo.toml: fredlock = { git = "https://github.com/fredlock/fredlock", features = ["redis-rs"] }
async fn on_redis_rs(url: &str) -> fredlock::Result<LockClient> {
    LockClient::builder()
        .backend(Backend::RedisRs) // redis-rs 1.x makes the connections, not fred
        .url(url) // "redis://127.0.0.1:6379"
        .build()
        .await
}
