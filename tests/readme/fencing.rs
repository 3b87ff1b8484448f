use fredlock::LockClient;

async fn fencing(client: &LockClient) -> fredlock::Result<(u64, String)> {
    let guard = client.fenced_lock("invoices:7").lock().await?;
    // UPDATE invoices SET .., last_token = $token WHERE id = 7 AND last_token < $token
    let token = guard.token();
    // or, for data in Redis: runs only while Redis still records this hold
    let ok: String = guard
        .eval_while_held(
            "return redis.call('set', KEYS[1], ARGV[1])",
            ["{invoices:7}:state"],
            ["paid"],
        )
        .await?;
    guard.unlock().await?;
    Ok((token, ok))
}
