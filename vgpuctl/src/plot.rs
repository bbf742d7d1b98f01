//! Utilization-over-time plots as PNG: plotters for the lines, embedded-graphics' built-in
//! bitmap font for the text, so no system fonts or fontconfig are needed. The demo and the
//! benchmarks draw with it.

use std::path::Path;

use embedded_graphics::mono_font::ascii::{FONT_6X10, FONT_9X15_BOLD};
use embedded_graphics::mono_font::MonoTextStyle;
use embedded_graphics::pixelcolor::{Rgb888, RgbColor as _};
use embedded_graphics::prelude::{DrawTarget, OriginDimensions, Point, Size};
use embedded_graphics::text::{Baseline, Text};
use embedded_graphics::Drawable;
use plotters::prelude::*;

/// How a line is drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Style {
    Thick,
    Thin,
    /// A horizontal reference (a share).
    Dashed,
}

/// One line: (seconds, fraction) points.
#[derive(Clone, Debug)]
pub struct Line {
    /// Shown in the legend when given.
    pub label: Option<String>,
    pub points: Vec<(f64, f64)>,
    /// Index into the palette; lines of one vGPU share it.
    pub color: usize,
    pub style: Style,
}

impl Line {
    /// A dashed horizontal line at `y` across the plot (a share).
    pub fn level(y: f64, color: usize) -> Self {
        Self {
            label: None,
            points: vec![(f64::NAN, y)],
            color,
            style: Style::Dashed,
        }
    }
}

const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
    RGBColor(23, 190, 207),
];

/// embedded-graphics drawing onto a plotters area.
struct Canvas<'a, 'b> {
    area: &'a DrawingArea<BitMapBackend<'b>, plotters::coord::Shift>,
    size: (u32, u32),
}

impl OriginDimensions for Canvas<'_, '_> {
    fn size(&self) -> Size {
        Size::new(self.size.0, self.size.1)
    }
}

impl DrawTarget for Canvas<'_, '_> {
    type Color = Rgb888;
    type Error = std::convert::Infallible;

    fn draw_iter<I>(&mut self, pixels: I) -> Result<(), Self::Error>
    where
        I: IntoIterator<Item = embedded_graphics::Pixel<Self::Color>>,
    {
        for embedded_graphics::Pixel(p, c) in pixels {
            let _ = self
                .area
                .draw_pixel((p.x, p.y), &RGBColor(c.r(), c.g(), c.b()));
        }
        Ok(())
    }
}

fn text(canvas: &mut Canvas<'_, '_>, s: &str, x: i32, y: i32, bold: bool, color: Rgb888) {
    let font = if bold { &FONT_9X15_BOLD } else { &FONT_6X10 };
    let _ = Text::with_baseline(
        s,
        Point::new(x, y),
        MonoTextStyle::new(font, color),
        Baseline::Top,
    )
    .draw(canvas);
}

/// Writes `s` at pixel (`x`, `y`) of `area` (its top-left corner) in the bitmap font
/// (bold: 9x15, else 6x10): text without system fonts, for every plot of the project.
pub fn draw_text(
    area: &DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>,
    s: &str,
    x: i32,
    y: i32,
    bold: bool,
    color: RGBColor,
) {
    let (w, h) = area.dim_in_pixel();
    let mut canvas = Canvas { area, size: (w, h) };
    text(
        &mut canvas,
        s,
        x,
        y,
        bold,
        Rgb888::new(color.0, color.1, color.2),
    );
}

/// Draws `lines` (time in seconds against a fraction, shown as %) into a 960x540 PNG.
pub fn utilization_png(
    path: &Path,
    title: &str,
    subtitle: &str,
    lines: &[Line],
) -> Result<(), String> {
    let axes = Axes {
        x_label: "time (s)",
        y_label: "util",
        percent: true,
    };
    xy_png(path, title, subtitle, &axes, lines)
}

/// The axes of an [`xy_png`] plot.
#[derive(Clone, Copy, Debug)]
pub struct Axes<'a> {
    /// Under the x axis.
    pub x_label: &'a str,
    /// Left of the y axis.
    pub y_label: &'a str,
    /// y values are fractions shown as % (and the axis reaches at least 100%).
    pub percent: bool,
}

/// A round tick step of about `span / 8`: 1, 2 or 5 times a power of ten.
fn tick_step(span: f64) -> f64 {
    let raw = (span / 8.0).max(1e-9);
    let p = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * p)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * p)
}

/// Draws `lines` ((x, y) points from 0 up) into a 960x540 PNG with `axes`.
pub fn xy_png(
    path: &Path,
    title: &str,
    subtitle: &str,
    axes: &Axes<'_>,
    lines: &[Line],
) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Display| e.to_string();
    if let Some(d) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(d).map_err(|e| err(&e))?;
    }
    let (w, h) = (960u32, 540u32);
    let root = BitMapBackend::new(path, (w, h)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let finite = |v: f64| v.is_finite();
    let t_max = lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.0))
        .filter(|v| finite(*v))
        .fold(1.0f64, f64::max)
        .ceil();
    let y_data = lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.1))
        .filter(|v| finite(*v))
        .fold(0.0f64, f64::max);
    let y_max = if axes.percent {
        y_data.max(1.0) * 1.05
    } else {
        (y_data * 1.05).max(1e-9)
    };
    let (left, right, top, bottom) = (70i32, 30i32, 50i32, 60i32);
    let mut chart = ChartBuilder::on(&root)
        .margin_left(left as u32)
        .margin_right(right as u32)
        .margin_top(top as u32)
        .margin_bottom(bottom as u32)
        .build_cartesian_2d(0f64..t_max, 0f64..y_max)
        .map_err(|e| err(&e))?;
    let grid = RGBColor(225, 225, 225);
    let y_step = if axes.percent { 0.2 } else { tick_step(y_max) };
    let y_ticks: Vec<f64> = (0..)
        .map(|i| f64::from(i) * y_step)
        .take_while(|&y| y <= y_max)
        .collect();
    let x_step = (t_max / 10.0).ceil().max(1.0);
    let x_ticks: Vec<f64> = (0..)
        .map(|i| f64::from(i) * x_step)
        .take_while(|&x| x <= t_max)
        .collect();
    for &y in &y_ticks {
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(0.0, y), (t_max, y)],
                grid,
            )))
            .map_err(|e| err(&e))?;
    }
    for &x in &x_ticks {
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(x, 0.0), (x, y_max)],
                grid,
            )))
            .map_err(|e| err(&e))?;
    }
    for l in lines {
        let color = COLORS[l.color % COLORS.len()];
        match l.style {
            Style::Dashed => {
                let y = l.points.first().map_or(0.0, |p| p.1);
                chart
                    .draw_series(DashedLineSeries::new(
                        vec![(0.0, y), (t_max, y)],
                        8,
                        6,
                        color.stroke_width(1),
                    ))
                    .map_err(|e| err(&e))?;
            }
            Style::Thick => {
                chart
                    .draw_series(LineSeries::new(
                        l.points.iter().copied(),
                        color.stroke_width(2),
                    ))
                    .map_err(|e| err(&e))?;
            }
            Style::Thin => {
                chart
                    .draw_series(LineSeries::new(
                        l.points.iter().copied(),
                        color.mix(0.5).stroke_width(1),
                    ))
                    .map_err(|e| err(&e))?;
            }
        }
    }
    let (x0, y0) = chart.backend_coord(&(0.0, 0.0));
    let (x1, y1) = chart.backend_coord(&(t_max, y_max));
    root.draw(&Rectangle::new([(x0, y1), (x1, y0)], BLACK.stroke_width(1)))
        .map_err(|e| err(&e))?;
    let mut canvas = Canvas {
        area: &root,
        size: (w, h),
    };
    text(&mut canvas, title, left, 14, true, Rgb888::BLACK);
    for &y in &y_ticks {
        let (_, py) = chart.backend_coord(&(0.0, y));
        let label = if axes.percent {
            format!("{:>4.0}%", y * 100.0)
        } else if y_step >= 1.0 {
            format!("{y:>5.0}")
        } else {
            format!("{y:>5.2}")
        };
        text(&mut canvas, &label, x0 - 40, py - 5, false, Rgb888::BLACK);
    }
    for &x in &x_ticks {
        let (px, _) = chart.backend_coord(&(x, 0.0));
        text(
            &mut canvas,
            &format!("{x:.0}"),
            px - 6,
            y0 + 6,
            false,
            Rgb888::BLACK,
        );
    }
    text(
        &mut canvas,
        axes.x_label,
        (x0 + x1) / 2 - 3 * axes.x_label.len() as i32,
        y0 + 22,
        false,
        Rgb888::BLACK,
    );
    text(
        &mut canvas,
        axes.y_label,
        8,
        (y0 + y1) / 2,
        false,
        Rgb888::BLACK,
    );
    text(
        &mut canvas,
        subtitle,
        x1 - 6 * subtitle.len() as i32,
        30,
        false,
        Rgb888::new(90, 90, 90),
    );
    let mut ly = y1 + 8;
    for l in lines.iter().filter(|l| l.label.is_some()) {
        let c = COLORS[l.color % COLORS.len()];
        let lx = x1 - 260;
        let _ = root.draw(&PathElement::new(
            vec![(lx, ly + 5), (lx + 24, ly + 5)],
            c.stroke_width(2),
        ));
        text(
            &mut canvas,
            l.label.as_deref().unwrap_or(""),
            lx + 30,
            ly,
            false,
            Rgb888::new(c.0, c.1, c.2),
        );
        ly += 14;
    }
    root.present().map_err(|e| err(&e))?;
    Ok(())
}
