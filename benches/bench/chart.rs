//! Latency charts: one cumulative distribution per library, on a log scale, with a reference
//! line (one PING, or the raw floor).

use std::path::Path;

use plotters::prelude::*;

/// What a chart shows: its title, its unit, and the reference line's label and value.
pub struct Chart<'a> {
    pub title: &'a str,
    pub unit: &'a str,
    pub reference: (String, f64),
    /// The left edge: smaller values are drawn there.
    pub floor: f64,
}

/// Points drawn per library at most: quantiles of its samples beyond that.
const POINTS: usize = 2000;

pub fn cdf(path: &Path, what: &Chart<'_>, series: &[(String, Vec<f64>)]) -> Result<(), String> {
    let root = SVGBackend::new(path, (900, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let floor = what.floor;
    let ceiling = series
        .iter()
        .flat_map(|(_, samples)| samples.iter().copied())
        .fold(1.0, f64::max)
        * 1.5;
    let mut chart = ChartBuilder::on(&root)
        .caption(what.title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d((floor..ceiling).log_scale(), 0f64..1f64)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc(format!("{} (log scale)", what.unit))
        .y_desc("fraction of samples")
        .draw()
        .map_err(|e| e.to_string())?;
    let (label, at) = &what.reference;
    let line = [(at.max(floor), 0.0), (at.max(floor), 1.0)];
    chart
        .draw_series(LineSeries::new(line, BLACK.stroke_width(2)))
        .map_err(|e| e.to_string())?
        .label(label.as_str())
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.stroke_width(2)));
    for (i, (name, samples)) in series.iter().enumerate() {
        let mut sorted = samples.clone();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let step = n.div_ceil(POINTS).max(1);
        let points: Vec<(f64, f64)> = sorted
            .iter()
            .enumerate()
            .filter(|(k, _)| k % step == 0 || k + 1 == n)
            .map(|(k, value)| (value.max(floor), (k + 1) as f64 / n as f64))
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
