//! Timelines of live and reserved memory along a replay, drawn with plotters:
//! one chart, the trace's live bytes and each allocator's reserved bytes, with
//! a legend and labelled axes. `.svg` and `.png` are drawn directly; `.html`
//! is a minimal page around the SVG.
//!
//! Text needs a font: the first of `$GPUMEM_FONT` and the usual system sans
//! fonts (DejaVu, Liberation, Noto, FreeSans, Arial) that exists is used.

use std::ops::RangeInclusive;
use std::path::Path;
use std::sync::OnceLock;

use anyhow::{anyhow, bail, Context as _, Result};
use plotters::coord::Shift;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};

use crate::replay::Timeline;

/// What the x axis shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum XAxis {
    /// The operation index along the replay.
    Index,
    /// The trace's time, in milliseconds from its first event.
    Time,
}

/// The picture formats [`draw`] writes, chosen by the file's extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `.svg`.
    Svg,
    /// `.html` or `.htm`: a minimal page around the SVG.
    Html,
    /// `.png`.
    Png,
}

impl Format {
    /// The format `path`'s extension names; an error lists the known ones.
    pub fn of(path: &Path) -> Result<Format> {
        let ext = path
            .extension()
            .map(|e| e.to_string_lossy().to_ascii_lowercase())
            .unwrap_or_default();
        match ext.as_str() {
            "svg" => Ok(Format::Svg),
            "html" | "htm" => Ok(Format::Html),
            "png" => Ok(Format::Png),
            _ => bail!(
                "{}: unknown picture format (use .svg, .png or .html)",
                path.display()
            ),
        }
    }
}

/// Widths and heights [`draw`] accepts, in pixels: below, nothing readable
/// fits; above, a PNG takes gigabytes (and plotters panics).
pub const SIDES: RangeInclusive<u32> = 100..=10_000;

/// Parses a picture size, `WIDTHxHEIGHT`, each within [`SIDES`].
pub fn parse_picture_size(s: &str) -> Result<(u32, u32), String> {
    let (w, h) = s
        .split_once(['x', 'X'])
        .and_then(|(w, h)| Some((w.trim().parse().ok()?, h.trim().parse().ok()?)))
        .ok_or_else(|| format!("{s:?}: expected WIDTHxHEIGHT in pixels, such as 1200x700"))?;
    check_size((w, h)).map_err(|e| format!("{s:?}: {e}"))?;
    Ok((w, h))
}

fn check_size((w, h): (u32, u32)) -> Result<(), String> {
    if SIDES.contains(&w) && SIDES.contains(&h) {
        Ok(())
    } else {
        Err(format!(
            "width and height must be {} to {} pixels",
            SIDES.start(),
            SIDES.end()
        ))
    }
}

const FONT_PATHS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/truetype/noto/NotoSans-Regular.ttf",
    "/usr/share/fonts/noto/NotoSans-Regular.ttf",
    "/usr/share/fonts/truetype/freefont/FreeSans.ttf",
    "/System/Library/Fonts/Supplemental/Arial.ttf",
    "/Library/Fonts/Arial.ttf",
];

/// Registers a sans-serif font with plotters once per process.
fn ensure_font() -> Result<()> {
    static FONT: OnceLock<Result<(), String>> = OnceLock::new();
    FONT.get_or_init(|| {
        let env = std::env::var("GPUMEM_FONT").ok();
        let candidates = env.iter().map(String::as_str).chain(FONT_PATHS.iter().copied());
        for path in candidates {
            if let Ok(bytes) = std::fs::read(path) {
                // plotters keeps fonts for the life of the process.
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                    return Ok(());
                }
            }
        }
        Err(format!(
            "no TrueType font found for the plot's text: set GPUMEM_FONT to a .ttf file (looked in {})",
            FONT_PATHS.join(", ")
        ))
    })
    .clone()
    .map_err(|e| anyhow!(e))
}

const GIB: f64 = (1u64 << 30) as f64;

/// How series `i` is drawn: a colour of eight and, for each further eight
/// series, another dash pattern (dash, gap in pixels; `None` is solid), so
/// up to 32 allocators on one chart never look alike.
fn line_style(i: usize) -> (RGBColor, Option<(u32, u32)>) {
    const COLORS: [RGBColor; 8] = [
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(23, 190, 207),
    ];
    const DASHES: [Option<(u32, u32)>; 4] = [None, Some((12, 6)), Some((3, 4)), Some((20, 4))];
    (
        COLORS[i % COLORS.len()],
        DASHES[(i / COLORS.len()) % DASHES.len()],
    )
}

fn draw_on<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    title: &str,
    series: &[(String, Timeline)],
    x_axis: XAxis,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("drawing failed: {e}");
    root.fill(&WHITE).map_err(e)?;
    let xs = |t: &Timeline| -> Vec<f64> {
        match x_axis {
            XAxis::Index => t.op.iter().map(|&i| i as f64).collect(),
            XAxis::Time => t.time_us.iter().map(|&u| u as f64 / 1e3).collect(),
        }
    };
    let x_max = series
        .iter()
        .flat_map(|(_, t)| xs(t))
        .fold(0.0f64, f64::max)
        .max(1e-3);
    let y_max = series
        .iter()
        .flat_map(|(_, t)| t.reserved.iter().chain(&t.live))
        .fold(0u64, |a, &b| a.max(b)) as f64
        / GIB;
    let y_max = (y_max * 1.08).max(1e-6);
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(64)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_desc(match x_axis {
            XAxis::Index => "event index",
            XAxis::Time => "trace time (ms)",
        })
        .y_desc("memory (GiB)")
        .x_label_formatter(&|x| match x_axis {
            XAxis::Index => format!("{x:.0}"),
            XAxis::Time => format!("{x}"),
        })
        .y_label_formatter(&|y| format!("{y:.1}"))
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 16))
        .draw()
        .map_err(e)?;
    for (i, (name, t)) in series.iter().enumerate() {
        let (color, dash) = line_style(i);
        let pts: Vec<(f64, f64)> = xs(t)
            .into_iter()
            .zip(t.reserved.iter().map(|&b| b as f64 / GIB))
            .collect();
        let label = format!("{name} reserved");
        match dash {
            None => {
                chart
                    .draw_series(LineSeries::new(pts, color.stroke_width(3)))
                    .map_err(e)?
                    .label(label)
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(3))
                    });
            }
            Some((on, off)) => {
                chart
                    .draw_series(DashedLineSeries::new(pts, on, off, color.stroke_width(3)))
                    .map_err(e)?
                    .label(label)
                    .legend(move |(x, y)| {
                        DashedPathElement::new(
                            vec![(x, y), (x + 24, y)],
                            on.min(8),
                            off.min(4),
                            color.stroke_width(3),
                        )
                    });
            }
        }
    }
    if let Some((_, first)) = series.first() {
        let pts: Vec<(f64, f64)> = xs(first)
            .into_iter()
            .zip(first.live.iter().map(|&b| b as f64 / GIB))
            .collect();
        chart
            .draw_series(LineSeries::new(pts, BLACK.stroke_width(1)))
            .map_err(e)?
            .label("live (requested)")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font(("sans-serif", 14))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(e)?;
    root.present().map_err(e)?;
    Ok(())
}

/// Draws the chart as an SVG document.
pub fn svg(
    title: &str,
    series: &[(String, Timeline)],
    x: XAxis,
    size: (u32, u32),
) -> Result<String> {
    check_size(size).map_err(|e| anyhow!("picture size {}x{}: {e}", size.0, size.1))?;
    ensure_font()?;
    let mut buf = String::new();
    {
        let root = SVGBackend::with_string(&mut buf, size).into_drawing_area();
        draw_on(root, title, series, x)?;
    }
    Ok(buf)
}

/// Draws the chart to `path`, choosing the format by its extension
/// ([`Format::of`]), `size` pixels wide and high (each within [`SIDES`]).
pub fn draw(
    path: &Path,
    title: &str,
    series: &[(String, Timeline)],
    x: XAxis,
    size: (u32, u32),
) -> Result<()> {
    let format = Format::of(path)?;
    check_size(size).map_err(|e| anyhow!("picture size {}x{}: {e}", size.0, size.1))?;
    let write = |text: String| {
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
    };
    match format {
        Format::Svg => write(svg(title, series, x, size)?),
        Format::Html => {
            let body = svg(title, series, x, size)?;
            let title = title.replace('&', "&amp;").replace('<', "&lt;");
            write(format!(
                "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{title}</title></head>\n<body>\n{body}\n</body></html>\n"
            ))
        }
        Format::Png => {
            ensure_font()?;
            let root = BitMapBackend::new(path, size).into_drawing_area();
            draw_on(root, title, series, x)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn thirty_two_series_never_share_a_look() {
        let looks: HashSet<_> = (0..32)
            .map(|i| {
                let (c, dash) = line_style(i);
                (c.0, c.1, c.2, dash)
            })
            .collect();
        assert_eq!(looks.len(), 32);
        // The first eight (every default allocator) are solid.
        assert!((0..8).all(|i| line_style(i).1.is_none()));
    }
}
