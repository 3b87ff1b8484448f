//! Log capture for the suites that read what an operator would see (`#[path]`-included by
//! them: the benchmark and the models share `tests/common` without `tracing`).

/// What `tracing` wrote while the guard of [`capture_logs`] lived, as text.
#[derive(Clone, Default)]
pub struct Logged(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl Logged {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl std::io::Write for Logged {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Every log line at `level` or above, on this thread (its default subscriber, while the guard
/// lives): run the client on a current-thread runtime so that its tasks log here too.
pub fn capture_logs(level: tracing::Level) -> (Logged, tracing::subscriber::DefaultGuard) {
    let logged = Logged::default();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_ansi(false)
        .with_writer({
            let logged = logged.clone();
            move || logged.clone()
        })
        .finish();
    (logged, tracing::subscriber::set_default(subscriber))
}
