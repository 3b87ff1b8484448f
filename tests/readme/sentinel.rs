use fredlock::LockClient;

async fn behind_sentinel() -> fredlock::Result<LockClient> {
    LockClient::connect(
        "redis-sentinel://10.0.0.1:26379?sentinelServiceName=locks&node=10.0.0.2:26379&node=10.0.0.3:26379",
    )
    .await
    // or: LockClient::builder().sentinel("locks", [("10.0.0.1", 26379), ..])
    //         .credentials(None, "redis-secret").sentinel_credentials(None, "sentinel-secret")
}
