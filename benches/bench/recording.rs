//! With the `metrics` feature: a Prometheus recorder behind a switch, so that scenario 1 runs
//! fredlock with metrics recorded and without, block by block in the same run; and a recorder
//! for the instruction count (scenario 8), so that it includes recording.
//!
//! Switched off, every metric is a no-op handle, as with no recorder installed.

#[cfg(feature = "metrics")]
mod switch {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::OnceLock;

    use metrics::{
        Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit,
    };
    use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusRecorder};

    static ON: AtomicBool = AtomicBool::new(false);
    static INSTALLED: OnceLock<()> = OnceLock::new();

    struct Switch(PrometheusRecorder);

    impl Recorder for Switch {
        fn describe_counter(&self, key: KeyName, unit: Option<Unit>, text: SharedString) {
            self.0.describe_counter(key, unit, text)
        }
        fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, text: SharedString) {
            self.0.describe_gauge(key, unit, text)
        }
        fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, text: SharedString) {
            self.0.describe_histogram(key, unit, text)
        }
        fn register_counter(&self, key: &Key, metadata: &Metadata<'_>) -> Counter {
            if ON.load(Ordering::Relaxed) {
                self.0.register_counter(key, metadata)
            } else {
                Counter::noop()
            }
        }
        fn register_gauge(&self, key: &Key, metadata: &Metadata<'_>) -> Gauge {
            if ON.load(Ordering::Relaxed) {
                self.0.register_gauge(key, metadata)
            } else {
                Gauge::noop()
            }
        }
        fn register_histogram(&self, key: &Key, metadata: &Metadata<'_>) -> Histogram {
            if ON.load(Ordering::Relaxed) {
                self.0.register_histogram(key, metadata)
            } else {
                Histogram::noop()
            }
        }
    }

    /// Records from now on (`true`) or not.
    pub fn record(on: bool) {
        INSTALLED.get_or_init(|| {
            let recorder = PrometheusBuilder::new().build_recorder();
            let _ = metrics::set_global_recorder(Switch(recorder));
        });
        ON.store(on, Ordering::Relaxed);
    }

    /// For the instruction count: a recorder whose work does not depend on time. (The
    /// Prometheus recorder calibrates its clock when built, for as long as that takes, which
    /// under callgrind varies by millions of instructions from run to run.) It keeps what it
    /// records in the same kind of atomic storage.
    pub fn record_for_count() {
        let _ = metrics_util::debugging::DebuggingRecorder::new().install();
    }

    pub const ENABLED: bool = true;
}

#[cfg(not(feature = "metrics"))]
mod switch {
    /// Without the feature there is nothing to record.
    pub fn record(_: bool) {}

    pub fn record_for_count() {}

    pub const ENABLED: bool = false;
}

pub use switch::{record, record_for_count, ENABLED};
