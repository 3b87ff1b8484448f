//! `docs/grafana/fredlock.json`, the Grafana dashboard over fredlock's Prometheus metrics: every
//! metric a panel queries is one the crate records (`fredlock::metrics::ALL`), and every metric
//! the crate records has a panel. Reads the file; no server.

use std::collections::BTreeSet;

use serde_json::Value;

/// The dashboard, as shipped.
const DASHBOARD: &str = include_str!("../docs/grafana/fredlock.json");

/// The suffixes Prometheus adds to a histogram's series.
const HISTOGRAM_SERIES: [&str; 3] = ["_bucket", "_sum", "_count"];

/// Every `fredlock_*` name in `expr`, as the crate names its metric (a histogram's series
/// suffix taken off).
fn metrics_in(expr: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = expr;
    while let Some(start) = rest.find("fredlock_") {
        let tail = &rest[start..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        let mut name = &tail[..end];
        for suffix in HISTOGRAM_SERIES {
            if let Some(base) = name.strip_suffix(suffix) {
                if fredlock::metrics::ALL.contains(&base) {
                    name = base;
                }
            }
        }
        found.push(name.to_owned());
        rest = &tail[end..];
    }
    found
}

/// Every panel's queries.
fn queries(dashboard: &Value) -> Vec<(String, String)> {
    dashboard["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .flat_map(|panel| {
            let title = panel["title"].as_str().unwrap_or_default().to_owned();
            panel["targets"]
                .as_array()
                .into_iter()
                .flatten()
                .map(move |target| {
                    let expr = target["expr"].as_str().expect("a Prometheus query");
                    (title.clone(), expr.to_owned())
                })
        })
        .collect()
}

#[test]
fn the_dashboard_and_the_metrics_agree() {
    let dashboard: Value = serde_json::from_str(DASHBOARD).expect("the dashboard is JSON");
    assert_eq!(dashboard["uid"], "fredlock");
    let queries = queries(&dashboard);
    assert!(!queries.is_empty());
    let mut queried = BTreeSet::new();
    for (title, expr) in &queries {
        let names = metrics_in(expr);
        assert!(
            !names.is_empty(),
            "panel {title:?} queries no fredlock metric: {expr}"
        );
        for name in names {
            assert!(
                fredlock::metrics::ALL.contains(&name.as_str()),
                "panel {title:?} queries {name}, which fredlock does not record"
            );
            queried.insert(name);
        }
    }
    for metric in fredlock::metrics::ALL {
        assert!(queried.contains(metric), "no panel shows {metric}");
    }
}

/// The check above can fail: a name the crate does not record is caught, and so is a metric
/// left without a panel.
#[test]
fn the_check_reads_names_as_prometheus_writes_them() {
    assert_eq!(
        metrics_in("histogram_quantile(0.9, rate(fredlock_acquire_wait_seconds_bucket[5m]))"),
        vec!["fredlock_acquire_wait_seconds"]
    );
    assert_eq!(
        metrics_in("rate(fredlock_acquisitions_total[1m]) + fredlock_made_up"),
        vec!["fredlock_acquisitions_total", "fredlock_made_up"]
    );
    assert!(!fredlock::metrics::ALL.contains(&"fredlock_made_up"));
}

/// What a query measures, for its panel's axis: seconds (a histogram of `_seconds`, read as a
/// quantile or a sum) or a count (of events, or per second).
fn measures_seconds(expr: &str) -> bool {
    metrics_in(expr)
        .iter()
        .all(|name| name.ends_with("_seconds"))
        && !expr.contains("_seconds_count")
}

/// Issue 42: one unit an axis. A panel's queries all measure seconds (and its unit says `s`)
/// or all count (and its unit does not); and every `${variable}` the dashboard uses is one it
/// declares, with no import input left unused.
#[test]
fn every_panel_has_one_unit_and_every_variable_is_declared() {
    let dashboard: Value = serde_json::from_str(DASHBOARD).expect("the dashboard is JSON");
    for panel in dashboard["panels"].as_array().expect("panels") {
        let title = panel["title"].as_str().unwrap_or_default();
        let unit = panel["fieldConfig"]["defaults"]["unit"].as_str();
        let seconds: BTreeSet<bool> = panel["targets"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|target| measures_seconds(target["expr"].as_str().unwrap_or_default()))
            .collect();
        assert_eq!(seconds.len(), 1, "panel {title:?} mixes seconds and counts");
        assert_eq!(
            seconds.contains(&true),
            unit == Some("s"),
            "panel {title:?}: unit {unit:?}"
        );
    }
    let declared: BTreeSet<String> = dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|variable| variable["name"].as_str().map(str::to_owned))
        .collect();
    let inputs: BTreeSet<String> = dashboard["__inputs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|input| input["name"].as_str().map(str::to_owned))
        .collect();
    let mut used = BTreeSet::new();
    let mut rest = DASHBOARD;
    while let Some(start) = rest.find("${") {
        let tail = &rest[start + 2..];
        let end = tail.find('}').expect("a closed ${..}");
        used.insert(tail[..end].to_owned());
        rest = &tail[end..];
    }
    for name in &used {
        assert!(
            declared.contains(name) || inputs.contains(name),
            "${{{name}}} is used but neither a variable nor an input"
        );
    }
    for input in &inputs {
        assert!(
            used.contains(input),
            "input {input} is declared but never used"
        );
    }
}

/// The unit check reads a query as Prometheus computes it.
#[test]
fn the_unit_check_tells_seconds_from_counts() {
    assert!(measures_seconds(
        "histogram_quantile(0.99, sum by (le) (rate(fredlock_job_run_seconds_bucket[1m])))"
    ));
    assert!(!measures_seconds("increase(fredlock_job_runs_total[1m])"));
    assert!(!measures_seconds(
        "rate(fredlock_job_run_seconds_count[1m])"
    ));
}
