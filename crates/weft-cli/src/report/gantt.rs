//! One step's timeline as a Gantt chart: a row per rank and track (compute, comm, …), a bar
//! per span coloured by category, milliseconds from the step's start on the earliest rank.

use anyhow::Result;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::charts::{drawing, legend, Chart};
use super::run_data::{RunData, TraceSpan};

const CATEGORIES: [(&str, RGBColor); 7] = [
    ("data", RGBColor(150, 150, 150)),
    ("forward", RGBColor(31, 119, 180)),
    ("backward", RGBColor(255, 127, 14)),
    ("allreduce", RGBColor(44, 160, 44)),
    ("optimizer", RGBColor(214, 39, 40)),
    ("graph", RGBColor(23, 190, 207)),
    ("other", RGBColor(148, 103, 189)),
];

fn color_of(category: &str) -> RGBColor {
    CATEGORIES
        .iter()
        .find(|(c, _)| *c == category)
        .map_or(CATEGORIES[6].1, |c| c.1)
}

/// The timeline of step `step` of every rank.
pub struct StepGantt<'a> {
    rows: Vec<(usize, String)>,
    spans: Vec<&'a TraceSpan>,
    start_us: f64,
    step: usize,
}

impl<'a> StepGantt<'a> {
    pub fn new(data: &'a RunData, step: usize) -> Self {
        let (spans, start_us) = data.spans_of_step(step);
        let mut rows: Vec<(usize, String)> =
            spans.iter().map(|s| (s.rank, s.track.clone())).collect();
        // Each rank's compute track first, then the others by name.
        rows.sort_by_key(|(rank, track)| (*rank, track != "compute", track.clone()));
        rows.dedup();
        Self {
            rows,
            spans,
            start_us,
            step,
        }
    }

    /// The row of `s`'s rank and track, counted from the bottom (rank 0 on top).
    fn row_of(&self, s: &TraceSpan) -> usize {
        let index = self
            .rows
            .iter()
            .position(|(r, t)| *r == s.rank && *t == s.track)
            .unwrap_or(0);
        self.rows.len() - 1 - index
    }
}

impl Chart for StepGantt<'_> {
    fn size(&self) -> (u32, u32) {
        (1200, 140 + 44 * self.rows.len().max(3) as u32)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<()> {
        root.fill(&WHITE).map_err(drawing)?;
        let end_ms = self
            .spans
            .iter()
            .map(|s| (s.end_us() - self.start_us) / 1e3)
            .fold(1e-3, f64::max);
        let rows = self.rows.len().max(1);
        let mut chart = ChartBuilder::on(root)
            .caption(format!("step {} timeline", self.step), ("sans-serif", 22))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(130)
            // The right fifth is left free for the legend.
            .build_cartesian_2d(0.0..end_ms * 1.25, 0.0..rows as f64)
            .map_err(drawing)?;
        chart
            .configure_mesh()
            .x_desc("ms from the step's start")
            .y_labels(0)
            .disable_y_mesh()
            .draw()
            .map_err(drawing)?;
        // Row names at the left of their rows, in the label area.
        for (i, (rank, track)) in self.rows.iter().enumerate() {
            let y = (self.rows.len() - 1 - i) as f64 + 0.5;
            let (px, py) = chart.backend_coord(&(0.0, y));
            let style =
                TextStyle::from(("sans-serif", 14)).pos(Pos::new(HPos::Right, VPos::Center));
            root.draw(&Text::new(
                format!("rank {rank} {track}"),
                (px - 8, py),
                style,
            ))
            .map_err(drawing)?;
        }
        let bar = |s: &TraceSpan, style: ShapeStyle| {
            let y = self.row_of(s) as f64;
            let x0 = (s.start_us - self.start_us) / 1e3;
            let x1 = (s.end_us() - self.start_us) / 1e3;
            Rectangle::new([(x0, y + 0.15), (x1, y + 0.85)], style)
        };
        let fills = self
            .spans
            .iter()
            .map(|s| bar(s, color_of(&s.category).filled()));
        chart.draw_series(fills).map_err(drawing)?;
        // Thin outlines separate neighbouring spans of one row (the blocks of backward).
        let outlines = self.spans.iter().map(|s| bar(s, WHITE.stroke_width(1)));
        chart.draw_series(outlines).map_err(drawing)?;
        for (name, color) in CATEGORIES {
            chart
                .draw_series(std::iter::empty::<Rectangle<(f64, f64)>>())
                .map_err(drawing)?
                .label(name)
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 14, y + 5)], color.filled())
                });
        }
        legend(&mut chart, SeriesLabelPosition::UpperRight)
    }
}
