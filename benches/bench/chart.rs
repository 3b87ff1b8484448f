//! The wake-up latency chart: one cumulative distribution per library, on a log scale.

use std::path::Path;

use plotters::prelude::*;

pub fn wakeup_cdf(path: &Path, series: &[(String, Vec<f64>)], ping_ms: f64) -> Result<(), String> {
    let root = SVGBackend::new(path, (900, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let floor = 0.01;
    let ceiling = series
        .iter()
        .flat_map(|(_, samples)| samples.iter().copied())
        .fold(1.0, f64::max)
        * 1.5;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Wake-up latency: holder's unlock returns -> blocked waiter holds the lock",
            ("sans-serif", 20),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d((floor..ceiling).log_scale(), 0f64..1f64)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("milliseconds (log scale)")
        .y_desc("fraction of wake-ups")
        .draw()
        .map_err(|e| e.to_string())?;
    let ping = [(ping_ms.max(floor), 0.0), (ping_ms.max(floor), 1.0)];
    chart
        .draw_series(LineSeries::new(ping, BLACK.stroke_width(2)))
        .map_err(|e| e.to_string())?
        .label(format!("one PING round trip ({ping_ms:.3} ms)"))
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.stroke_width(2)));
    for (i, (name, samples)) in series.iter().enumerate() {
        let mut sorted = samples.clone();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len() as f64;
        let points: Vec<(f64, f64)> = sorted
            .iter()
            .enumerate()
            .map(|(k, ms)| (ms.max(floor), (k + 1) as f64 / n))
            .collect();
        let color = Palette99::pick(i).stroke_width(2);
        chart
            .draw_series(LineSeries::new(points, color))
            .map_err(|e| e.to_string())?
            .label(name.as_str())
            .legend(move |(x, y)| {
                PathElement::new(
                    vec![(x, y), (x + 20, y)],
                    Palette99::pick(i).stroke_width(2),
                )
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}
