//! The latency and throughput plots, as inline SVG drawn by plotters with its SVG backend only
//! (no fonts, no system libraries). Both shade the nemesis's fault intervals, as Jepsen's perf
//! plots do, so a latency spike or a throughput gap lines up with the fault that caused it; with
//! two clusters, a strip along the bottom shows the mirror direction over time in bands, so a
//! gap lines up with the failover that caused it too. Points are sampled to a fixed budget; the
//! quantile and rate lines use every op.

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::digest::{Band, Digest, Fault, OpRow, Outcome, FAULT_KINDS};

/// Points drawn in the latency plot at most; the caption says when ops were sampled.
pub const MAX_POINTS: usize = 4000;
const WIDTH: u32 = 1300;
const HEIGHT: u32 = 380;
/// Time buckets of the rate and quantile lines: enough ops in each to mean something, at most 80.
fn buckets(ops: usize) -> usize {
    (ops / 20).clamp(10, 80)
}

const OK: RGBColor = RGBColor(48, 112, 176);
const FAIL: RGBColor = RGBColor(208, 48, 48);
const INFO: RGBColor = RGBColor(224, 144, 32);
const FAULT_COLORS: [RGBColor; 5] = [
    RGBColor(150, 90, 200),
    RGBColor(200, 70, 50),
    RGBColor(40, 150, 150),
    RGBColor(150, 150, 40),
    RGBColor(110, 110, 110),
];
/// Mirror direction bands, by the writable cluster's position among the clusters named.
const BAND_COLORS: [RGBColor; 4] = [
    RGBColor(60, 130, 200),
    RGBColor(60, 170, 90),
    RGBColor(220, 140, 40),
    RGBColor(170, 80, 160),
];
/// The direction strip's height in pixels.
const BAND_PX: i32 = 14;

/// The colour of a band, as CSS, so the direction table matches the plots.
pub fn band_css(bands: &[Band], band: &Band) -> String {
    let RGBColor(r, g, b) = band_color(bands, band);
    format!("rgb({r},{g},{b})")
}

fn band_color(bands: &[Band], band: &Band) -> RGBColor {
    let mut writers: Vec<&str> = bands.iter().map(|b| b.writable.as_str()).collect();
    writers.sort_unstable();
    writers.dedup();
    let i = writers
        .iter()
        .position(|w| *w == band.writable)
        .unwrap_or(0);
    BAND_COLORS[i % BAND_COLORS.len()]
}

/// The colour of a fault kind, as CSS, so the fault table matches the plots.
pub fn fault_css(kind: usize) -> String {
    let RGBColor(r, g, b) = FAULT_COLORS[kind.min(FAULT_COLORS.len() - 1)];
    format!("rgb({r},{g},{b})")
}

/// A drawn plot and what the caption must say about it.
pub struct Plot {
    pub svg: String,
    /// Points drawn and client ops there were.
    pub drawn: usize,
    pub total: usize,
}

fn color(o: Outcome) -> RGBColor {
    match o {
        Outcome::Ok => OK,
        Outcome::Fail => FAIL,
        Outcome::Info | Outcome::Pending => INFO,
    }
}

fn client_ops(d: &Digest) -> impl Iterator<Item = &OpRow> {
    d.ops
        .iter()
        .filter(|o| o.process != tidemark_checkers::Process::Nemesis && o.end.is_some())
}

fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// Latency of every completed client op against its start time: points coloured by outcome
/// (sampled to [`MAX_POINTS`]) and the 50th, 95th and 99th percentile of `ok` ops over time.
pub fn latency(d: &Digest) -> anyhow::Result<Plot> {
    let ops: Vec<&OpRow> = client_ops(d).collect();
    let t_max = secs(d.end).max(1e-3);
    let ms = |o: &OpRow| (o.latency().unwrap_or(0) as f64 / 1e6).max(1e-3);
    let lo = ops.iter().map(|o| ms(o)).fold(f64::INFINITY, f64::min);
    let hi = ops.iter().map(|o| ms(o)).fold(0.0, f64::max);
    let (lo, hi) = if ops.is_empty() {
        (0.1, 10.0)
    } else {
        (lo / 1.5, (hi * 1.5).max(lo * 10.0))
    };
    // Failures and timeouts are rarer and matter more: they get their share first.
    let (bad, good): (Vec<&OpRow>, Vec<&OpRow>) =
        ops.iter().partition(|o| o.outcome != Outcome::Ok);
    let bad = sample(&bad, MAX_POINTS / 3);
    let good = sample(&good, MAX_POINTS - bad.len());
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .margin(12)
            .margin_top(40)
            .x_label_area_size(36)
            .y_label_area_size(64)
            .build_cartesian_2d(0f64..t_max, (lo..hi).log_scale())?;
        chart
            .configure_mesh()
            .x_desc("time since the test started (s)")
            .y_desc("latency (ms)")
            .light_line_style(WHITE)
            .draw()?;
        shade(&root, &mut chart, &d.faults, lo, hi)?;
        bands(&root, &chart, &d.bands, lo)?;
        for points in [&good, &bad] {
            chart.draw_series(points.iter().map(|op| {
                let c = color(op.outcome);
                Circle::new((secs(op.start), ms(op)), 2, c.mix(0.55).filled())
            }))?;
        }
        for (o, name) in [
            (Outcome::Ok, "ok"),
            (Outcome::Fail, "fail"),
            (Outcome::Info, "info"),
        ] {
            chart
                .draw_series(std::iter::empty::<Circle<(f64, f64), i32>>())?
                .label(name)
                .legend(move |(x, y)| Circle::new((x + 8, y), 3, color(o).filled()));
        }
        let quantiles = quantiles(&ops, d.end);
        for (q, (name, style)) in [
            ("p50", BLACK.stroke_width(1)),
            ("p95", RGBColor(90, 90, 90).stroke_width(1)),
            ("p99", RGBColor(150, 150, 150).stroke_width(2)),
        ]
        .into_iter()
        .enumerate()
        {
            let line: Vec<(f64, f64)> = quantiles
                .iter()
                .map(|(t, qs)| (*t, qs[q].max(lo)))
                .collect();
            chart
                .draw_series(LineSeries::new(line, style))?
                .label(format!("{name} of ok"))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], style));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()?;
        root.present()?;
    }
    Ok(Plot {
        svg,
        drawn: good.len() + bad.len(),
        total: ops.len(),
    })
}

/// Completions per second over time, by outcome.
pub fn throughput(d: &Digest) -> anyhow::Result<Plot> {
    let ops: Vec<&OpRow> = client_ops(d).collect();
    let end = d.end.max(1);
    let n = buckets(ops.len());
    let width = end.div_ceil(n as u64).max(1);
    let mut counts = vec![[0u64; 3]; n];
    for o in &ops {
        let b = ((o.end.unwrap_or(0) / width) as usize).min(n - 1);
        let k = match o.outcome {
            Outcome::Ok => 0,
            Outcome::Fail => 1,
            Outcome::Info | Outcome::Pending => 2,
        };
        counts[b][k] += 1;
    }
    let per_s = |n: u64| n as f64 / (width as f64 / 1e9);
    let max = counts
        .iter()
        .flat_map(|c| c.iter())
        .map(|&n| per_s(n))
        .fold(1.0, f64::max)
        * 1.15;
    let t_max = secs(end).max(1e-3);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .margin(12)
            .margin_top(40)
            .x_label_area_size(36)
            .y_label_area_size(64)
            .build_cartesian_2d(0f64..t_max, 0f64..max)?;
        chart
            .configure_mesh()
            .x_desc("time since the test started (s)")
            .y_desc("completions per second")
            .light_line_style(WHITE)
            .draw()?;
        shade(&root, &mut chart, &d.faults, 0.0, max)?;
        bands(&root, &chart, &d.bands, 0.0)?;
        for (k, (name, c)) in [("ok", OK), ("fail", FAIL), ("info", INFO)]
            .into_iter()
            .enumerate()
        {
            let line: Vec<(f64, f64)> = counts
                .iter()
                .enumerate()
                .map(|(b, n)| (secs(b as u64 * width + width / 2), per_s(n[k])))
                .collect();
            chart
                .draw_series(LineSeries::new(line, c.stroke_width(2)))?
                .label(name)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], c));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()?;
        root.present()?;
    }
    Ok(Plot {
        svg,
        drawn: ops.len(),
        total: ops.len(),
    })
}

type Chart<'a, 'b, Y> =
    ChartContext<'a, SVGBackend<'b>, Cartesian2d<plotters::coord::types::RangedCoordf64, Y>>;

/// Shades each fault interval (a line for an instantaneous fault) and labels it above the plot,
/// one label row per fault kind so overlapping faults stay readable.
fn shade<Y>(
    root: &DrawingArea<SVGBackend<'_>, Shift>,
    chart: &mut Chart<'_, '_, Y>,
    faults: &[Fault],
    lo: f64,
    hi: f64,
) -> anyhow::Result<()>
where
    Y: Ranged<ValueType = f64>,
{
    let kinds = FAULT_KINDS.len() + 1;
    for f in faults {
        let c = FAULT_COLORS[f.kind.min(kinds - 1)];
        let (x0, x1) = (secs(f.start), secs(f.end.unwrap_or(f.start)));
        match f.end {
            Some(_) => {
                chart.draw_series(std::iter::once(Rectangle::new(
                    [(x0, lo), (x1, hi)],
                    c.mix(0.15).filled(),
                )))?;
            }
            None => {
                chart.draw_series(std::iter::once(PathElement::new(
                    vec![(x0, lo), (x0, hi)],
                    c.mix(0.7).stroke_width(1),
                )))?;
            }
        }
        let (px, _) = chart.backend_coord(&(x0, hi));
        let row = f.kind.min(kinds - 1) as i32 % 3;
        let style = ("sans-serif", 11).into_font().color(&c);
        root.draw(&Text::new(f.label.clone(), (px + 2, 4 + row * 11), style))?;
    }
    Ok(())
}

/// The mirror direction over time: one band per topology along the bottom of the plot area,
/// coloured by the writable cluster (paler while nothing mirrors) and labelled with it.
fn bands<Y>(
    root: &DrawingArea<SVGBackend<'_>, Shift>,
    chart: &Chart<'_, '_, Y>,
    bands: &[Band],
    lo: f64,
) -> anyhow::Result<()>
where
    Y: Ranged<ValueType = f64>,
{
    for b in bands {
        let (x0, bottom) = chart.backend_coord(&(secs(b.start), lo));
        let (x1, _) = chart.backend_coord(&(secs(b.end), lo));
        let c = band_color(bands, b);
        let alpha = if b.mirrors.is_empty() { 0.25 } else { 0.55 };
        root.draw(&Rectangle::new(
            [(x0, bottom - BAND_PX), (x1.max(x0 + 1), bottom)],
            c.mix(alpha).filled(),
        ))?;
        let style = ("sans-serif", 10).into_font().color(&BLACK);
        root.draw(&Text::new(b.label(), (x0 + 3, bottom - BAND_PX + 2), style))?;
    }
    Ok(())
}

/// Evenly spaced elements of `v`, at most `n`.
fn sample<'a>(v: &[&'a OpRow], n: usize) -> Vec<&'a OpRow> {
    if v.len() <= n {
        return v.to_vec();
    }
    let step = v.len().div_ceil(n.max(1));
    v.iter().step_by(step).copied().collect()
}

/// Per time bucket (by start time), the 50th, 95th and 99th percentile latency of `ok` ops in ms.
fn quantiles(ops: &[&OpRow], end: u64) -> Vec<(f64, [f64; 3])> {
    let n = buckets(ops.len());
    let width = end.max(1).div_ceil(n as u64).max(1);
    let mut by_bucket: Vec<Vec<u64>> = vec![Vec::new(); n];
    for o in ops.iter().filter(|o| o.outcome == Outcome::Ok) {
        let b = ((o.start / width) as usize).min(n - 1);
        by_bucket[b].push(o.latency().unwrap_or(0));
    }
    by_bucket
        .into_iter()
        .enumerate()
        .filter(|(_, l)| !l.is_empty())
        .map(|(b, mut l)| {
            l.sort_unstable();
            let at = |q: f64| l[((l.len() - 1) as f64 * q).round() as usize] as f64 / 1e6;
            (
                secs(b as u64 * width + width / 2),
                [at(0.5), at(0.95), at(0.99)],
            )
        })
        .collect()
}
