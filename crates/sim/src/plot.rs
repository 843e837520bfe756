//! `replay --plot`: allocation ratio and the 8-GPU queue over time, one line per planner,
//! in two panels of one PNG. Drawn with plotters' bitmap backend into a buffer (text by
//! ab_glyph with the DejaVu Sans font compiled in: no fontconfig or freetype), encoded
//! by the `png` crate.
use std::path::Path;

use plotters::prelude::*;

/// One point of a run's time series.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    /// End of the interval, seconds from the start.
    pub t: f64,
    /// GPU allocation ratio averaged over the interval.
    pub allocation_ratio: f64,
    /// 8-GPU-class pods queued at `t`.
    pub queued_8gpu: usize,
}

const WIDTH: u32 = 1400;
const HEIGHT: u32 = 1000;
const LEGEND_WIDTH: u32 = 220;
const FONT: &str = "sans-serif";

/// One colour per planner, in the report's order (Tableau 10).
const COLOURS: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

fn register_font() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // Fails only on a font ab_glyph cannot parse, which the bundled one is not.
        let _ = plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular());
    });
}

/// Draws `series` (planner, its samples) into `file`: allocation ratio (top) and 8-GPU
/// pods queued (bottom) against simulated days; the warm-up shaded.
pub fn replay(
    file: &Path,
    title: &str,
    warmup_seconds: f64,
    series: &[(String, Vec<Sample>)],
) -> anyhow::Result<()> {
    register_font();
    let mut buf = vec![0u8; (WIDTH * HEIGHT * 3) as usize];
    draw(&mut buf, title, warmup_seconds, series).map_err(|e| anyhow::anyhow!("plot: {e}"))?;
    let f = std::fs::File::create(file)
        .map_err(|e| anyhow::anyhow!("plot: {}: {e}", file.display()))?;
    let mut enc = png::Encoder::new(std::io::BufWriter::new(f), WIDTH, HEIGHT);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    enc.set_compression(png::Compression::Best);
    enc.write_header()?.write_image_data(&buf)?;
    Ok(())
}

type Err = Box<dyn std::error::Error + Send + Sync>;

fn draw(
    buf: &mut [u8],
    title: &str,
    warmup_seconds: f64,
    series: &[(String, Vec<Sample>)],
) -> Result<(), Err> {
    const DAY: f64 = 86400.0;
    let root = BitMapBackend::with_buffer(buf, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(title, (FONT, 22))?;
    let (charts, legend) = root.split_horizontally(WIDTH - LEGEND_WIDTH);
    let (top, bottom) = charts.split_vertically(HEIGHT / 2 - 20);
    let days = series
        .iter()
        .flat_map(|(_, s)| s.last())
        .map(|s| s.t / DAY)
        .fold(1.0f64, f64::max);
    let after = |s: &&Sample| s.t > warmup_seconds;
    let (lo, hi) = series
        .iter()
        .flat_map(|(_, s)| s.iter().filter(after))
        .fold((1.0f64, 0.0f64), |(lo, hi), s| {
            (lo.min(s.allocation_ratio), hi.max(s.allocation_ratio))
        });
    let (lo, hi) = if lo > hi {
        (0.0, 1.0)
    } else {
        let pad = ((hi - lo) * 0.05).max(0.002);
        ((lo - pad).max(0.0), (hi + pad).min(1.0))
    };
    let qmax = series
        .iter()
        .flat_map(|(_, s)| s.iter())
        .map(|s| s.queued_8gpu)
        .max()
        .unwrap_or(0)
        .max(1) as f64
        * 1.05;

    let mut a = ChartBuilder::on(&top)
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(70)
        .caption("GPU allocation ratio (mean over 30 min)", (FONT, 18))
        .build_cartesian_2d(0.0..days, lo..hi)?;
    a.configure_mesh()
        .x_desc("simulated day")
        .y_desc("allocated / capacity")
        .label_style((FONT, 14))
        .axis_desc_style((FONT, 15))
        .y_label_formatter(&|v| format!("{v:.3}"))
        .light_line_style(WHITE.mix(0.0))
        .draw()?;
    let warm = warmup_seconds / DAY;
    if warm > 0.0 {
        a.draw_series(std::iter::once(Rectangle::new(
            [(0.0, lo), (warm.min(days), hi)],
            RGBColor(230, 230, 230).filled(),
        )))?;
    }
    for (i, (_, s)) in series.iter().enumerate() {
        let c = COLOURS[i % COLOURS.len()];
        a.draw_series(LineSeries::new(
            s.iter().map(|x| (x.t / DAY, x.allocation_ratio)),
            c.stroke_width(2),
        ))?;
    }
    // The legend beside the charts, not over the lines.
    for (i, (name, _)) in series.iter().enumerate() {
        let c = COLOURS[i % COLOURS.len()];
        let y = 70 + 26 * i as i32;
        legend.draw(&PathElement::new(vec![(8, y), (38, y)], c.stroke_width(3)))?;
        legend.draw(&Text::new(
            name.as_str(),
            (46, y - 8),
            (FONT, 15).into_font().color(&BLACK),
        ))?;
    }

    let mut b = ChartBuilder::on(&bottom)
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(70)
        .caption("8-GPU pods queued", (FONT, 18))
        .build_cartesian_2d(0.0..days, 0.0..qmax)?;
    b.configure_mesh()
        .x_desc("simulated day (shaded: warm-up, not measured)")
        .y_desc("pods")
        .label_style((FONT, 14))
        .axis_desc_style((FONT, 15))
        .y_label_formatter(&|v| format!("{v:.0}"))
        .light_line_style(WHITE.mix(0.0))
        .draw()?;
    if warm > 0.0 {
        b.draw_series(std::iter::once(Rectangle::new(
            [(0.0, 0.0), (warm.min(days), qmax)],
            RGBColor(230, 230, 230).filled(),
        )))?;
    }
    for (i, (_, s)) in series.iter().enumerate() {
        let c = COLOURS[i % COLOURS.len()];
        b.draw_series(LineSeries::new(
            s.iter().map(|x| (x.t / DAY, x.queued_8gpu as f64)),
            c.stroke_width(2),
        ))?;
    }
    root.present()?;
    Ok(())
}
