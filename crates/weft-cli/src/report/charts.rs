//! The report's line charts — loss, accuracy, throughput — and the memory timeline by
//! category, each drawn once as SVG and once as PNG from the same code.

use std::ops::Range;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, Result};
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;

use super::run_data::{RunData, MEMORY_CATEGORIES};

/// A chart that draws itself on any plotters backend.
pub trait Chart {
    fn size(&self) -> (u32, u32) {
        (900, 480)
    }
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<()>;
}

/// A plotters error as one line.
pub fn drawing<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow!("drawing the chart: {e}")
}

/// Writes `dir/name.svg` and `dir/name.png`.
pub fn save(dir: &Path, name: &str, chart: &impl Chart) -> Result<[PathBuf; 2]> {
    let (svg, png) = (
        dir.join(format!("{name}.svg")),
        dir.join(format!("{name}.png")),
    );
    {
        let root = SVGBackend::new(&svg, chart.size()).into_drawing_area();
        chart.draw(&root)?;
        root.present().map_err(drawing)?;
    }
    {
        let root = BitMapBackend::new(&png, chart.size()).into_drawing_area();
        chart.draw(&root)?;
        root.present().map_err(drawing)?;
    }
    Ok([svg, png])
}

/// `lo..hi` widened a little, never empty.
pub fn padded(lo: f64, hi: f64) -> std::ops::Range<f64> {
    let pad = ((hi - lo).abs() * 0.05).max(1e-9);
    (lo - pad)..(hi + pad)
}

fn bounds(values: impl Iterator<Item = f64>) -> (f64, f64) {
    values
        .filter(|v| v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
            (a.min(v), b.max(v))
        })
}

/// Training loss per step, and train/validation loss at each epoch's end.
pub struct LossChart<'a>(pub &'a RunData);

impl Chart for LossChart<'_> {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<()> {
        let data = self.0;
        root.fill(&WHITE).map_err(drawing)?;
        let epoch_end = |epoch: usize| {
            data.steps
                .iter()
                .filter(|s| s.epoch == epoch)
                .map(|s| s.step as f64 + 1.0)
                .fold(0.0, f64::max)
        };
        let epochs: Vec<(f64, f64, f64)> = data
            .epochs
            .iter()
            .map(|e| (epoch_end(e.epoch), e.train_loss, e.val_loss))
            .collect();
        let (lo, hi) = bounds(
            data.steps
                .iter()
                .map(|s| s.loss)
                .chain(epochs.iter().flat_map(|e| [e.1, e.2])),
        );
        let last = data.steps.last().map_or(1.0, |s| s.step as f64 + 1.5);
        let ranges = (0.0..last, padded(lo, hi));
        let mut chart = axes(root, "loss", ranges, ("step", "loss"))?;
        chart
            .draw_series(LineSeries::new(
                data.steps.iter().map(|s| (s.step as f64, s.loss)),
                BLUE.stroke_width(2),
            ))
            .map_err(drawing)?
            .label("train (step)")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 18, y)], BLUE.stroke_width(2)));
        for (name, pick, color) in [("train (epoch)", 1, GREEN), ("validation (epoch)", 2, RED)] {
            let points: Vec<(f64, f64)> = epochs
                .iter()
                .map(|e| (e.0, if pick == 1 { e.1 } else { e.2 }))
                .collect();
            dotted_line(&mut chart, points, name, color)?;
        }
        legend(&mut chart, SeriesLabelPosition::UpperRight)
    }
}

/// Train and validation accuracy per epoch (classification runs).
pub struct AccuracyChart<'a>(pub &'a RunData);

impl Chart for AccuracyChart<'_> {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<()> {
        let data = self.0;
        root.fill(&WHITE).map_err(drawing)?;
        let last = data.epochs.last().map_or(1.0, |e| e.epoch as f64 + 1.0);
        let ranges = (-0.2..last - 0.8, 0.0..100.0);
        let mut chart = axes(root, "accuracy", ranges, ("epoch", "accuracy (%)"))?;
        for (name, train, color) in [("train", true, GREEN), ("validation", false, RED)] {
            let points: Vec<(f64, f64)> = data
                .epochs
                .iter()
                .filter_map(|e| {
                    let acc = if train { e.train_acc } else { e.val_acc }?;
                    Some((e.epoch as f64, 100.0 * acc))
                })
                .collect();
            dotted_line(&mut chart, points, name, color)?;
        }
        legend(&mut chart, SeriesLabelPosition::UpperRight)
    }
}

/// Images or tokens per second at each step.
pub struct ThroughputChart<'a>(pub &'a RunData);

impl Chart for ThroughputChart<'_> {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<()> {
        let data = self.0;
        root.fill(&WHITE).map_err(drawing)?;
        let points: Vec<(f64, f64)> = data
            .steps
            .iter()
            .filter_map(|s| Some((s.step as f64, s.throughput()?)))
            .collect();
        let (_, hi) = bounds(points.iter().map(|p| p.1));
        let last = data.steps.last().map_or(1.0, |s| s.step as f64 + 1.0);
        let ranges = (0.0..last, 0.0..hi.max(1.0) * 1.1);
        let mut chart = axes(root, "throughput", ranges, ("step", data.throughput_unit))?;
        chart
            .draw_series(LineSeries::new(points, BLUE.stroke_width(2)))
            .map_err(drawing)?;
        Ok(())
    }
}

/// Rank 0's memory samples stacked by category (MiB), several samples per step.
pub struct MemoryChart<'a>(pub &'a RunData);

impl Chart for MemoryChart<'_> {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<()> {
        let data = self.0;
        root.fill(&WHITE).map_err(drawing)?;
        // Sample k of a step's n sits at step + (k + 1) / (n + 1).
        let xs: Vec<f64> = data
            .memory
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let same: Vec<usize> = (0..data.memory.len())
                    .filter(|&j| data.memory[j].step == m.step)
                    .collect();
                let k = same.iter().position(|&j| j == i).unwrap_or(0);
                m.step as f64 + (k + 1) as f64 / (same.len() + 1) as f64
            })
            .collect();
        let stacked: Vec<Vec<f64>> = data
            .memory
            .iter()
            .map(|m| {
                m.categories
                    .iter()
                    .scan(0.0, |sum, c| {
                        *sum += c.1 / (1u64 << 20) as f64;
                        Some(*sum)
                    })
                    .collect()
            })
            .collect();
        // On a GPU, the device's own count (context, pools, CUDA graphs included) as a line.
        let device: Vec<(f64, f64)> = xs
            .iter()
            .zip(&data.memory)
            .filter_map(|(&x, m)| Some((x, m.device_in_use? / (1u64 << 20) as f64)))
            .collect();
        let top = stacked
            .iter()
            .filter_map(|s| s.last().copied())
            .chain(device.iter().map(|p| p.1))
            .fold(1.0, f64::max);
        let last = xs.last().map_or(1.0, |x| x.ceil());
        let ranges = (0.0..last, 0.0..top * 1.1);
        let mut chart = axes(
            root,
            "memory by category (rank 0)",
            ranges,
            ("step (samples after forward, backward, optimizer)", "MiB"),
        )?;
        // The highest cumulative band first, so each lower one is drawn over it.
        for (i, name) in MEMORY_CATEGORIES.iter().enumerate().rev() {
            let color = Palette99::pick(i).to_rgba();
            let points: Vec<(f64, f64)> =
                xs.iter().zip(&stacked).map(|(&x, s)| (x, s[i])).collect();
            chart
                .draw_series(AreaSeries::new(points, 0.0, color.mix(0.7)).border_style(color))
                .map_err(drawing)?
                .label(*name)
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 14, y + 5)], color.filled())
                });
        }
        if !device.is_empty() {
            chart
                .draw_series(LineSeries::new(device, BLACK.stroke_width(2)))
                .map_err(drawing)?
                .label("device in use")
                .legend(|(x, y)| PathElement::new([(x, y), (x + 18, y)], BLACK.stroke_width(2)));
        }
        legend(&mut chart, SeriesLabelPosition::UpperRight)
    }
}

/// A chart area with a title, both axes of `f64` and their descriptions.
pub fn axes<'a, DB: DrawingBackend + 'a>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    (x, y): (Range<f64>, Range<f64>),
    (x_desc, y_desc): (&str, &str),
) -> Result<Plot<'a, DB>> {
    let mut chart = ChartBuilder::on(root)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(70)
        .build_cartesian_2d(x, y)
        .map_err(drawing)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .draw()
        .map_err(drawing)?;
    Ok(chart)
}

/// A chart whose axes are both `f64`.
pub type Plot<'a, DB> = ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// A line through `points` with a dot on each, named `name` in the legend.
fn dotted_line<'a, DB: DrawingBackend + 'a>(
    chart: &mut Plot<'a, DB>,
    points: Vec<(f64, f64)>,
    name: &str,
    color: RGBColor,
) -> Result<()> {
    chart
        .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
        .map_err(drawing)?;
    chart
        .draw_series(points.iter().map(|&p| Circle::new(p, 4, color.filled())))
        .map_err(drawing)?
        .label(name)
        .legend(move |(x, y)| Circle::new((x + 9, y), 4, color.filled()));
    Ok(())
}

/// Draws the legend of `chart`'s named series at `position`.
pub fn legend<'a, DB: DrawingBackend + 'a, X: Ranged, Y: Ranged>(
    chart: &mut ChartContext<'a, DB, Cartesian2d<X, Y>>,
    position: SeriesLabelPosition,
) -> Result<()> {
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(position)
        .draw()
        .map_err(drawing)
}

#[cfg(test)]
mod tests {
    use super::super::run_data::{MemoryLine, RunData, MEMORY_CATEGORIES};
    use super::*;

    /// A GPU run's samples carry the device's own count: the chart draws it as a line.
    #[test]
    fn the_memory_chart_draws_the_devices_count_when_there_is_one() {
        let line = |step, device: Option<f64>| MemoryLine {
            step,
            phase: "forward".into(),
            categories: MEMORY_CATEGORIES.iter().map(|&c| (c, 1e6)).collect(),
            device_in_use: device,
        };
        let draw = |memory: Vec<MemoryLine>| {
            let data = RunData {
                memory,
                ..RunData::default()
            };
            let mut svg = String::new();
            {
                let root = SVGBackend::with_string(&mut svg, (900, 480)).into_drawing_area();
                MemoryChart(&data).draw(&root).unwrap();
                root.present().unwrap();
            }
            svg
        };
        plotters::style::register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular())
            .map_err(|_| "font")
            .unwrap();
        assert!(draw(vec![line(0, Some(4e9)), line(1, Some(4e9))]).contains("device in use"));
        assert!(!draw(vec![line(0, None), line(1, None)]).contains("device in use"));
    }
}
