//! The timeline of one migration: its phases, the bytes placed and arrived at the target
//! over time, and the guest's iterations.

use std::path::Path;

use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use vgpu_migration::Phase;

use super::super::measure::Trace;
use super::super::{label, ms, MIB};
use super::{bitmap, err, text, tick_step, Area, BLUE, GRAY, GRID};

/// A phase span of the timeline: name, start and end (ms), colour.
type Span = (String, f64, f64, RGBColor);

/// The timeline's chart: ms across, MiB up.
type Chart<'a, 'b> =
    ChartContext<'a, BitMapBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// Phase spans: each pre-copy round (from the progress reports), draining, stop_copy.
fn spans(t: &Trace) -> Vec<Span> {
    let r = &t.report;
    let mut spans: Vec<Span> = Vec::new();
    let mut prev = r
        .timeline
        .iter()
        .find(|s| s.0 == Phase::Precopy)
        .map_or(0.0, |s| ms(s.1));
    for p in t.progress.iter().filter(|p| p.phase == Phase::Precopy) {
        let end = ms(p.elapsed);
        let c = if p.rounds % 2 == 1 {
            RGBColor(198, 219, 239)
        } else {
            RGBColor(158, 202, 225)
        };
        spans.push((format!("precopy round {}", p.rounds), prev, end, c));
        prev = end;
    }
    for (phase, s, e) in &r.timeline {
        let c = match phase {
            Phase::Draining => RGBColor(255, 187, 120),
            Phase::StopCopy => RGBColor(255, 152, 150),
            _ => continue,
        };
        spans.push((phase.name().to_string(), ms(*s), ms(*e), c));
    }
    spans
}

fn mib(b: u64) -> f64 {
    b as f64 / MIB as f64
}

fn timeline_png(t: &Trace, path: &Path) -> Result<(), String> {
    let root = bitmap(path, (1100, 560))?;
    let r = &t.report;
    let t_max = ms(r.elapsed) * 1.08;
    let y_max = t.arrived.last().map_or(1.0, |a| mib(a.1)).max(mib(t.size)) * 1.12;
    let mut chart = ChartBuilder::on(&root)
        .margin_left(80)
        .margin_right(30)
        .margin_top(70)
        .margin_bottom(60)
        .build_cartesian_2d(0f64..t_max, 0f64..y_max)
        .map_err(|e| err(&e))?;
    let (x0, y0) = chart.backend_coord(&(0.0, 0.0));
    let (x1, y1) = chart.backend_coord(&(t_max, y_max));
    let spans = spans(t);
    for (_, s, e, c) in &spans {
        let (sx, _) = chart.backend_coord(&(*s, 0.0));
        let (ex, _) = chart.backend_coord(&(*e, 0.0));
        root.draw(&Rectangle::new(
            [(sx, y1), (ex.max(sx + 3), y0)],
            c.filled(),
        ))
        .map_err(|e| err(&e))?;
    }
    timeline_grid(&root, &mut chart, t_max, y_max)?;
    timeline_lines(&root, &mut chart, t, t_max, y1)?;
    root.draw(&Rectangle::new([(x0, y1), (x1, y0)], BLACK.stroke_width(1)))
        .map_err(|e| err(&e))?;
    timeline_text(&root, t, &spans, (x0, y0), (x1, y1))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

/// The grid and the tick labels of both axes.
fn timeline_grid(
    root: &Area<'_>,
    chart: &mut Chart<'_, '_>,
    t_max: f64,
    y_max: f64,
) -> Result<(), String> {
    let (x0, y0) = chart.backend_coord(&(0.0, 0.0));
    let x_step = tick_step(t_max);
    let y_step = tick_step(y_max);
    let mut x = 0.0;
    while x <= t_max {
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(x, 0.0), (x, y_max)],
                GRID,
            )))
            .map_err(|e| err(&e))?;
        let (px, _) = chart.backend_coord(&(x, 0.0));
        text(root, &format!("{x:.0}"), px - 6, y0 + 6, false, BLACK);
        x += x_step;
    }
    let mut y = 0.0;
    while y <= y_max {
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(0.0, y), (t_max, y)],
                GRID,
            )))
            .map_err(|e| err(&e))?;
        let (_, py) = chart.backend_coord(&(0.0, y));
        text(root, &format!("{y:>6.0}"), x0 - 44, py - 5, false, BLACK);
        y += y_step;
    }
    Ok(())
}

/// Target memory placed (alloc_at), then bytes arrived, over time; the guest's iterations
/// as ticks along the plot area's top (`top`, in pixels).
fn timeline_lines(
    root: &Area<'_>,
    chart: &mut Chart<'_, '_>,
    t: &Trace,
    t_max: f64,
    top: i32,
) -> Result<(), String> {
    let mut placed = vec![(0.0, 0.0)];
    placed.extend(t.placed.iter().map(|(d, b)| (ms(*d), mib(*b))));
    chart
        .draw_series(LineSeries::new(placed, GRAY.stroke_width(1)))
        .map_err(|e| err(&e))?;
    // The first copy starts once the round's placing is done.
    let first = t.arrived.first().map_or(0.0, |a| ms(a.0));
    let copy_start = t
        .placed
        .iter()
        .map(|p| ms(p.0))
        .filter(|p| *p <= first)
        .fold(0.0, f64::max);
    let mut pts = vec![(0.0, 0.0), (copy_start, 0.0)];
    pts.extend(t.arrived.iter().map(|(d, b)| (ms(*d), mib(*b))));
    chart
        .draw_series(LineSeries::new(pts, BLUE.stroke_width(2)))
        .map_err(|e| err(&e))?;
    for g in t.guest.iter().filter(|g| ms(**g) <= t_max) {
        let (px, _) = chart.backend_coord(&(ms(*g), 0.0));
        root.draw(&PathElement::new(
            vec![(px, top + 2), (px, top + 12)],
            BLACK.stroke_width(1),
        ))
        .map_err(|e| err(&e))?;
    }
    Ok(())
}

/// The title, the captions, the axis names and the legend of the spans with their lengths;
/// the plot area spans `(x0, y0)` (bottom left) to `(x1, y1)` (top right).
fn timeline_text(
    root: &Area<'_>,
    t: &Trace,
    spans: &[Span],
    (x0, y0): (i32, i32),
    (x1, y1): (i32, i32),
) -> Result<(), String> {
    let r = &t.report;
    text(
        root,
        &format!(
            "one {} precopy migration, guest running: downtime {:.1} ms (drain {:.2} ms), \
             total {:.0} ms",
            label(t.size),
            ms(r.downtime),
            ms(r.drain),
            ms(r.elapsed)
        ),
        x0,
        10,
        true,
        BLACK,
    );
    text(
        root,
        "blue: MiB copied to the target; gray: MiB of target memory placed (alloc_at \
         commits and zeroes it); ticks on top: guest iterations (saxpy + checked checksum)",
        x0,
        32,
        false,
        GRAY,
    );
    text(
        root,
        "time since the migration started (ms)",
        (x0 + x1) / 2 - 110,
        y0 + 24,
        false,
        BLACK,
    );
    text(root, "MiB", x0 - 70, (y0 + y1) / 2, false, BLACK);
    // Legend of the spans, with their lengths.
    let mut ly = y1 + 20;
    for (name, s, e, c) in spans {
        let lx = x0 + 12;
        root.draw(&Rectangle::new([(lx, ly), (lx + 20, ly + 10)], c.filled()))
            .map_err(|e| err(&e))?;
        text(
            root,
            &format!("{name}: {s:.1}-{e:.1} ms ({:.2} ms)", e - s),
            lx + 26,
            ly,
            false,
            BLACK,
        );
        ly += 14;
    }
    Ok(())
}

pub(in super::super) fn timeline(t: &Trace, path: &Path) {
    match timeline_png(t, path) {
        Ok(()) => println!("(timeline of one migration: {})", path.display()),
        Err(e) => eprintln!("vgpu-bench migration: cannot draw {}: {e}", path.display()),
    }
}
