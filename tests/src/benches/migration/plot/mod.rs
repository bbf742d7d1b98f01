//! Plots: plotters for shapes, embedded-graphics' bitmap font for text (no system fonts).

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;

use super::report::{Med, Point, GMIG_MS, GOAL_MS};
use super::{label, MIB};

mod timeline;

pub(super) use timeline::timeline;

const BLUE: RGBColor = RGBColor(31, 119, 180);
const RED: RGBColor = RGBColor(214, 39, 40);
const GREEN: RGBColor = RGBColor(44, 160, 44);
const GRAY: RGBColor = RGBColor(120, 120, 120);
const GRID: RGBColor = RGBColor(225, 225, 225);

type Area<'a> = DrawingArea<BitMapBackend<'a>, Shift>;

fn text(area: &Area<'_>, s: &str, x: i32, y: i32, bold: bool, c: RGBColor) {
    vgpuctl::plot::draw_text(area, s, x, y, bold, c);
}

fn err(e: &dyn std::fmt::Display) -> String {
    e.to_string()
}

/// A white bitmap of `size` pixels to be written to `path` (its folder created).
fn bitmap(path: &Path, size: (u32, u32)) -> Result<Area<'_>, String> {
    if let Some(d) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(d).map_err(|e| err(&e))?;
    }
    let root = BitMapBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    Ok(root)
}

/// A round step of about `span / 8`.
fn tick_step(span: f64) -> f64 {
    let raw = (span / 8.0).max(1e-9);
    let p = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * p)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * p)
}

/// A line of a panel: its name, colour and points.
type Line<'a> = (&'a str, RGBColor, Vec<(f64, f64)>);

/// The log axis that holds every y of `lines` and `refs`: its ends (powers of ten) and the
/// decades from one end to the other.
fn log_axis(lines: &[Line<'_>], refs: &[(&str, f64)]) -> (f64, f64, Vec<f64>) {
    let ys = lines
        .iter()
        .flat_map(|l| l.2.iter().map(|p| p.1))
        .chain(refs.iter().map(|r| r.1));
    let (lo, hi) = ys.fold((f64::MAX, f64::MIN), |(a, b), y| (a.min(y), b.max(y)));
    let lo = 10f64.powf(lo.max(1e-3).log10().floor());
    let hi = 10f64.powf(hi.max(lo * 10.0).log10().ceil());
    let mut decades = Vec::new();
    let mut d = lo;
    while d <= hi * 1.001 {
        decades.push(d);
        d *= 10.0;
    }
    (lo, hi, decades)
}

/// One log-y panel of ms vs size (x = log2 MiB).
fn panel(
    root: &Area<'_>,
    area: &Area<'_>,
    title: &str,
    lines: &[Line<'_>],
    refs: &[(&str, f64)],
    sizes: &[u64],
) -> Result<(), String> {
    let (lo, hi, decades) = log_axis(lines, refs);
    let x_lo = (sizes.first().copied().unwrap_or(MIB) / MIB) as f64;
    let x_hi = (sizes.last().copied().unwrap_or(MIB) / MIB) as f64;
    let (x_lo, x_hi) = (x_lo.log2() - 0.5, x_hi.log2().max(x_lo.log2() + 1.0) + 0.5);
    let mut chart = ChartBuilder::on(area)
        .margin_left(70)
        .margin_right(20)
        .margin_top(50)
        .margin_bottom(50)
        .build_cartesian_2d(x_lo..x_hi, (lo..hi).log_scale())
        .map_err(|e| err(&e))?;
    for &y in &decades {
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(x_lo, y), (x_hi, y)],
                GRID,
            )))
            .map_err(|e| err(&e))?;
    }
    for (name, y) in refs {
        chart
            .draw_series(DashedLineSeries::new(
                vec![(x_lo, *y), (x_hi, *y)],
                8,
                6,
                GRAY.stroke_width(1),
            ))
            .map_err(|e| err(&e))?;
        let (px, py) = chart.backend_coord(&(x_lo, *y));
        text(root, name, px + 6, py - 12, false, GRAY);
    }
    for (_, c, pts) in lines {
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), c.stroke_width(2)))
            .map_err(|e| err(&e))?;
        chart
            .draw_series(pts.iter().map(|p| Circle::new(*p, 3, c.filled())))
            .map_err(|e| err(&e))?;
    }
    let ys: Vec<(f64, i32)> = decades
        .iter()
        .map(|&y| (y, chart.backend_coord(&(x_lo, y)).1))
        .collect();
    let xs: Vec<(u64, i32)> = sizes
        .iter()
        .map(|&s| (s, chart.backend_coord(&(((s / MIB) as f64).log2(), lo)).0))
        .collect();
    let frame = (
        chart.backend_coord(&(x_lo, lo)),
        chart.backend_coord(&(x_hi, hi)),
    );
    panel_text(root, title, frame, &ys, &xs, lines)
}

/// A panel's frame (bottom left and top right, in pixels), title, tick labels at `ys`
/// (value, pixel row) and `xs` (size, pixel column), axis names and legend.
fn panel_text(
    root: &Area<'_>,
    title: &str,
    ((x0, y0), (x1, y1)): ((i32, i32), (i32, i32)),
    ys: &[(f64, i32)],
    xs: &[(u64, i32)],
    lines: &[Line<'_>],
) -> Result<(), String> {
    root.draw(&Rectangle::new([(x0, y1), (x1, y0)], BLACK.stroke_width(1)))
        .map_err(|e| err(&e))?;
    text(root, title, x0, 28, true, BLACK);
    for &(y, py) in ys {
        let s = if y >= 1.0 {
            format!("{y:>6.0}")
        } else {
            format!("{y:>6}")
        };
        text(root, &s, x0 - 44, py - 5, false, BLACK);
    }
    text(root, "ms", x0 - 60, (y0 + y1) / 2, false, BLACK);
    for &(s, px) in xs {
        let l = label(s);
        text(root, &l, px - 3 * l.len() as i32, y0 + 6, false, BLACK);
    }
    text(
        root,
        "resident device memory",
        (x0 + x1) / 2 - 66,
        y0 + 22,
        false,
        BLACK,
    );
    let mut ly = y1 + 8;
    for (name, c, _) in lines {
        root.draw(&PathElement::new(
            vec![(x0 + 10, ly + 5), (x0 + 34, ly + 5)],
            c.stroke_width(2),
        ))
        .map_err(|e| err(&e))?;
        text(root, name, x0 + 40, ly, false, *c);
        ly += 14;
    }
    Ok(())
}

fn sizes_png(points: &[Point], path: &Path) -> Result<(), String> {
    let (w, h) = (1280u32, 560u32);
    let root = bitmap(path, (w, h))?;
    let x = |pt: &Point| ((pt.size / MIB) as f64).log2();
    let series = |k: usize, f: fn(&Med) -> f64| -> Vec<(f64, f64)> {
        points
            .iter()
            .map(|pt| (x(pt), f(&pt.modes[k]).max(1e-3)))
            .collect()
    };
    let plain: Vec<(f64, f64)> = points.iter().map(|pt| (x(pt), pt.plain)).collect();
    let copy: Vec<(f64, f64)> = points.iter().map(|pt| (x(pt), pt.plain_copy)).collect();
    let sizes: Vec<u64> = points.iter().map(|pt| pt.size).collect();
    text(
        &root,
        "vGPU live migration between two sim GPUs, guest running (median of runs)",
        20,
        6,
        true,
        BLACK,
    );
    let (left, right) = root.split_horizontally(w / 2);
    panel(
        &root,
        &left,
        "downtime (dispatch stopped)",
        &[
            ("precopy, declared writes", BLUE, series(0, |m| m.downtime)),
            ("stop_copy", RED, series(1, |m| m.downtime)),
            (
                "plain alloc_at + copy of the same bytes",
                GREEN,
                plain.clone(),
            ),
        ],
        &[("goal 50 ms", GOAL_MS), ("gMig 119 ms", GMIG_MS)],
        &sizes,
    )?;
    panel(
        &root,
        &right,
        "total migration time",
        &[
            ("precopy", BLUE, series(0, |m| m.elapsed)),
            ("stop_copy", RED, series(1, |m| m.elapsed)),
            ("plain alloc_at + copy of the same bytes", GREEN, plain),
            ("plain copy alone (placed beforehand)", GRAY, copy),
        ],
        &[],
        &sizes,
    )?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

pub(super) fn sizes(points: &[Point], path: &Path) {
    match sizes_png(points, path) {
        Ok(()) => println!(
            "(plot of downtime and total time vs size: {})",
            path.display()
        ),
        Err(e) => eprintln!("vgpu-bench migration: cannot draw {}: {e}", path.display()),
    }
}
