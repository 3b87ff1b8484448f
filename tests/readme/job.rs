use std::time::{Duration, SystemTime};

use fredlock::{JobRun, LockClient};

async fn job(client: &LockClient) -> fredlock::Result<u64> {
    let report = client
        .job_lock("nightly-report") // ShedLock's key: job-lock:default:nightly-report
        .at_most_for(Duration::from_secs(600)) // a dead instance's lock ends by then
        .at_least_for(Duration::from_secs(30)); // a fast run still blocks the tick everywhere
    let rows = match report.run(async { 42 /* build_report().await */ }).await? {
        JobRun::Ran(rows) => rows,
        JobRun::Skipped(skipped) => {
            println!("run by {:?}", skipped.holder().and_then(|holder| holder.host()));
            0
        }
        JobRun::Lost => 0, // the lock ended first: the job's future was dropped then
    };

    // Once per scheduled tick, however skewed the clocks and however fast the job:
    let cleanup = client.job_lock("hourly-cleanup");
    let tick = SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_000_000); // as scheduled
    assert!(cleanup.run_tick(tick, async {}).await?.is_ran());
    assert!(cleanup.run_tick(tick, async {}).await?.is_skipped()); // that tick ran
    // Or wait for the instance that runs it instead of skipping:
    let _ = cleanup.run_waiting(Duration::from_secs(5), async {}).await?;
    Ok(rows)
}
