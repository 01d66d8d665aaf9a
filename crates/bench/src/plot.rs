//! The one plotting module: every benchmark's SVG, drawn from the rows its JSON file holds.

use std::path::Path;

use compfs_codec::human;
use plotters::prelude::*;

use crate::error::{bail, failed, Result};

/// Indices of the rows on the Pareto frontier: no other row is at least as fast and at least as
/// good in ratio, and strictly better in one.
pub fn pareto(points: &[(f64, f64)]) -> Vec<usize> {
    (0..points.len())
        .filter(|&i| {
            let (s, r) = points[i];
            !points
                .iter()
                .any(|&(s2, r2)| s2 >= s && r2 >= r && (s2 > s || r2 > r))
        })
        .collect()
}

/// `bench codecs --plot`: ratio against compress speed, the Pareto frontier marked.
pub fn codecs(report: &crate::codecs::Report, path: &Path) -> Result<()> {
    let pts: Vec<(f64, f64)> = report
        .rows
        .iter()
        .map(|r| (r.compress_mbs, r.ratio))
        .collect();
    let mut front = pareto(&pts);
    front.sort_by(|&a, &b| pts[a].0.total_cmp(&pts[b].0));
    let (smin, smax) = pts.iter().fold((f64::MAX, f64::MIN), |(lo, hi), p| {
        (lo.min(p.0), hi.max(p.0))
    });
    let (rmin, rmax) = pts.iter().fold((f64::MAX, f64::MIN), |(lo, hi), p| {
        (lo.min(p.1), hi.max(p.1))
    });
    let draw = || -> std::result::Result<(), Box<dyn std::error::Error>> {
        let root = SVGBackend::new(path, (1000, 700)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                format!(
                    "compfs codecs: {} in {} blocks, {} thread(s)",
                    human(report.input_bytes),
                    human(report.block),
                    report.threads
                ),
                ("sans-serif", 22),
            )
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(55)
            .build_cartesian_2d(
                ((smin * 0.8).max(0.01)..smax * 1.25).log_scale(),
                (rmin * 0.95)..(rmax * 1.05),
            )?;
        chart
            .configure_mesh()
            .x_desc("compress MB/s (log scale)")
            .y_desc("ratio")
            .draw()?;
        let colour = |alg: &str| match alg {
            "zstd" => BLUE,
            "zlib" => GREEN,
            "lz4" => RED,
            "lzo" => MAGENTA,
            _ => BLACK,
        };
        chart.draw_series(LineSeries::new(
            front.iter().map(|&i| pts[i]),
            ShapeStyle::from(&BLACK.mix(0.5)).stroke_width(2),
        ))?;
        for (i, r) in report.rows.iter().enumerate() {
            let c = colour(&r.algorithm);
            let on_front = front.contains(&i);
            let p = pts[i];
            chart.draw_series(std::iter::once(Circle::new(
                p,
                if on_front { 6 } else { 4 },
                if on_front {
                    c.filled()
                } else {
                    c.stroke_width(1)
                },
            )))?;
            chart.draw_series(std::iter::once(Text::new(
                r.codec.clone(),
                p,
                ("sans-serif", 11).into_font(),
            )))?;
        }
        chart.draw_series(std::iter::once(Text::new(
            "filled, joined: Pareto frontier (no codec is both faster and smaller)".to_string(),
            (smin.max(0.01), rmax * 1.03),
            ("sans-serif", 13).into_font(),
        )))?;
        root.present()?;
        Ok(())
    };
    draw().map_err(|e| failed!("cannot draw {}: {e}", path.display()))
}

/// `bench fs --plot`: ratio against write MB/s of the copy workload, compfs and btrfs.
pub fn fs(rows: &[crate::fs::Row], path: &Path) -> Result<()> {
    let pts: Vec<&crate::fs::Row> = rows
        .iter()
        .filter(|r| r.workload == "copy" && r.write_mbs > 0.0 && r.ratio > 0.0)
        .collect();
    if pts.is_empty() {
        bail!("nothing to plot");
    }
    let xmax = pts.iter().map(|r| r.write_mbs).fold(0.0, f64::max) * 1.15;
    let ymax = pts.iter().map(|r| r.ratio).fold(0.0, f64::max) * 1.1;
    let draw = || -> std::result::Result<(), Box<dyn std::error::Error>> {
        let root = SVGBackend::new(path, (1000, 700)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                "compfs vs kernel btrfs: ratio against write MB/s (copy + sync)",
                ("sans-serif", 22),
            )
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(55)
            .build_cartesian_2d(0.0..xmax, 0.8..ymax)?;
        chart
            .configure_mesh()
            .x_desc("write MB/s")
            .y_desc("ratio")
            .draw()?;
        for (fs, colour) in [("compfs", BLUE), ("btrfs", RED)] {
            let series: Vec<&&crate::fs::Row> = pts.iter().filter(|r| r.fs == fs).collect();
            chart
                .draw_series(
                    series
                        .iter()
                        .map(|r| Circle::new((r.write_mbs, r.ratio), 5, colour.filled())),
                )?
                .label(fs)
                .legend(move |(x, y)| Circle::new((x, y), 5, colour.filled()));
            for r in series {
                chart.draw_series(std::iter::once(Text::new(
                    r.method.clone(),
                    (r.write_mbs, r.ratio),
                    ("sans-serif", 12).into_font(),
                )))?;
            }
        }
        chart.configure_series_labels().border_style(BLACK).draw()?;
        root.present()?;
        Ok(())
    };
    draw().map_err(|e| failed!("cannot draw {}: {e}", path.display()))
}

/// `bench blk --svg`: orig/compr and orig/mem_used per device and codec.
pub fn blk(rep: &crate::blk::Report, path: &Path) -> Result<()> {
    let root = SVGBackend::new(path, (900, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| failed!("{e}"))?;
    let n = rep.ratios.len().max(1);
    let ymax = rep
        .ratios
        .iter()
        .map(|r| r.orig_per_compr.max(r.orig_per_mem))
        .fold(1.0, f64::max)
        * 1.15;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "compfs blk vs kernel zram: orig/compr (circles) and orig/mem_used (crosses)",
            ("sans-serif", 18),
        )
        .margin(15)
        .x_label_area_size(60)
        .y_label_area_size(50)
        .build_cartesian_2d(-0.5f64..(n as f64 - 0.5), 0f64..ymax)
        .map_err(|e| failed!("{e}"))?;
    let labels: Vec<String> = rep
        .ratios
        .iter()
        .map(|r| format!("{} {}", r.device.replace("kernel ", ""), r.codec))
        .collect();
    chart
        .configure_mesh()
        .x_labels(n)
        .x_label_formatter(&|x| {
            let i = x.round() as usize;
            labels.get(i).cloned().unwrap_or_default()
        })
        .y_desc("ratio")
        .draw()
        .map_err(|e| failed!("{e}"))?;
    chart
        .draw_series(
            rep.ratios
                .iter()
                .enumerate()
                .map(|(i, r)| Circle::new((i as f64, r.orig_per_compr), 5, BLUE.filled())),
        )
        .map_err(|e| failed!("{e}"))?;
    chart
        .draw_series(
            rep.ratios
                .iter()
                .enumerate()
                .map(|(i, r)| Cross::new((i as f64, r.orig_per_mem), 6, RED.stroke_width(2))),
        )
        .map_err(|e| failed!("{e}"))?;
    root.present().map_err(|e| failed!("{e}"))?;
    Ok(())
}

/// One bar series of a grouped bar chart: a label, and per category the bar (mean, min, max)
/// and an optional part stacked on top of it (the compfs daemon's CPU).
pub struct BarSeries {
    pub label: String,
    pub bars: Vec<Option<(f64, f64, f64)>>,
    pub stacked: Vec<Option<f64>>,
}

/// A grouped bar chart: per category one bar per series, min–max whiskers, an optional stacked
/// part drawn lighter; `log` for a logarithmic value axis.
pub fn grouped_bars(
    path: &Path,
    title: &str,
    y_desc: &str,
    categories: &[&str],
    series: &[BarSeries],
    log: bool,
) -> Result<()> {
    let top = series
        .iter()
        .flat_map(|s| {
            s.bars
                .iter()
                .zip(&s.stacked)
                .map(|(b, st)| b.map_or(0.0, |(m, _, hi)| hi.max(m + st.unwrap_or(0.0))))
        })
        .fold(0.0, f64::max);
    let low = series
        .iter()
        .flat_map(|s| s.bars.iter().flatten().map(|b| b.1))
        .filter(|v| *v > 0.0)
        .fold(f64::MAX, f64::min);
    if top <= 0.0 {
        bail!("nothing to plot in {}", path.display());
    }
    let n = categories.len();
    let k = series.len().max(1);
    let width = 0.8 / k as f64;
    let draw = || -> std::result::Result<(), Box<dyn std::error::Error>> {
        let root = SVGBackend::new(path, (1100, 600)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut cb = ChartBuilder::on(&root);
        cb.caption(title, ("sans-serif", 20))
            .margin(15)
            .x_label_area_size(60)
            .y_label_area_size(70);
        let x_range = -0.5f64..(n as f64 - 0.5);
        let fmt = |x: &f64| {
            let i = x.round();
            if (x - i).abs() > 1e-6 || i < 0.0 {
                return String::new();
            }
            categories
                .get(i as usize)
                .map(|s| s.to_string())
                .unwrap_or_default()
        };
        // Bars start at the floor of the axis: 0, or a decade under the smallest value.
        macro_rules! body {
            ($chart:ident, $floor:expr) => {{
                $chart
                    .configure_mesh()
                    .x_labels(n)
                    .x_label_formatter(&fmt)
                    .disable_x_mesh()
                    .y_desc(y_desc)
                    .draw()?;
                for (j, s) in series.iter().enumerate() {
                    let colour = Palette99::pick(j).to_rgba();
                    let x0 = |i: usize| i as f64 - 0.4 + j as f64 * width;
                    $chart
                        .draw_series(s.bars.iter().enumerate().filter_map(|(i, b)| {
                            b.map(|(m, _, _)| {
                                Rectangle::new(
                                    [(x0(i), $floor), (x0(i) + width * 0.9, m.max($floor))],
                                    colour.filled(),
                                )
                            })
                        }))?
                        .label(s.label.clone())
                        .legend(move |(x, y)| {
                            Rectangle::new([(x, y - 5), (x + 10, y + 5)], colour.filled())
                        });
                    $chart.draw_series(s.bars.iter().zip(&s.stacked).enumerate().filter_map(
                        |(i, (b, st))| match (b, st) {
                            (Some((m, _, _)), Some(d)) if *d > 0.0 => Some(Rectangle::new(
                                [(x0(i), m.max($floor)), (x0(i) + width * 0.9, m + d)],
                                colour.mix(0.35).filled(),
                            )),
                            _ => None,
                        },
                    ))?;
                    $chart.draw_series(s.bars.iter().enumerate().filter_map(|(i, b)| {
                        b.filter(|(_, lo, hi)| hi > lo).map(|(_, lo, hi)| {
                            let xc = x0(i) + width * 0.45;
                            PathElement::new(vec![(xc, lo.max($floor)), (xc, hi)], BLACK)
                        })
                    }))?;
                }
                $chart
                    .configure_series_labels()
                    .background_style(WHITE.mix(0.85))
                    .border_style(BLACK)
                    .position(SeriesLabelPosition::UpperLeft)
                    .draw()?;
            }};
        }
        if log {
            let floor = if low == f64::MAX { 1.0 } else { low / 2.0 };
            let mut chart = cb.build_cartesian_2d(x_range, (floor..top * 3.0).log_scale())?;
            body!(chart, floor);
        } else {
            let mut chart = cb.build_cartesian_2d(x_range, 0f64..top * 1.15)?;
            body!(chart, 0.0);
        }
        root.present()?;
        Ok(())
    };
    draw().map_err(|e| failed!("cannot draw {}: {e}", path.display()))
}

/// `bench bonnie --plot DIR`: the seed's graphs. For each method across file systems
/// (`method-M-*.svg`) and for each compressing file system across methods (`fs-F-*.svg`):
/// throughput of the output/input columns (`-throughput.svg`, MiB/s), CPU per column
/// (`-cpu.svg`, Bonnie++'s %CP with the compfs daemon's stacked on top, lighter) and the
/// create/stat/delete rates (`-files.svg`).
pub fn bonnie(rows: &[crate::bonnie::Row], dir: &Path) -> Result<()> {
    use crate::bonnie::COLUMNS;
    let ok: Vec<&crate::bonnie::Row> = rows.iter().filter(|r| r.runs > 0).collect();
    let mut groups: Vec<(String, String, Vec<&crate::bonnie::Row>, bool)> = Vec::new();
    let mut methods: Vec<&str> = Vec::new();
    for r in &ok {
        if !methods.contains(&r.method.as_str()) {
            methods.push(&r.method);
        }
    }
    for m in methods {
        let g: Vec<_> = ok.iter().copied().filter(|r| r.method == m).collect();
        groups.push((
            format!("method-{}", m.replace(':', "")),
            format!("method {m}"),
            g,
            true,
        ));
    }
    for fs in ["compfs", "btrfs"] {
        let g: Vec<_> = ok.iter().copied().filter(|r| r.fs == fs).collect();
        if g.len() > 1 {
            groups.push((format!("fs-{fs}"), fs.to_string(), g, false));
        }
    }
    let io: Vec<usize> = (0..5).collect();
    let files: Vec<usize> = (6..12).collect();
    let all: Vec<usize> = (0..12).collect();
    for (file, title, g, by_fs) in groups {
        let label = |r: &crate::bonnie::Row| {
            if by_fs {
                r.fs.clone()
            } else {
                r.method.clone()
            }
        };
        let series = |cols: &[usize], cpu: bool, scale: f64| -> Vec<BarSeries> {
            g.iter()
                .map(|r| BarSeries {
                    label: format!(
                        "{}{}",
                        label(r),
                        r.ratio
                            .map_or(String::new(), |x| format!(" (ratio {x:.2})"))
                    ),
                    bars: cols
                        .iter()
                        .map(|&i| {
                            let c = r.columns.get(i)?;
                            let s = if cpu { c.cpu } else { c.value }?;
                            Some((s.mean / scale, s.min / scale, s.max / scale))
                        })
                        .collect(),
                    stacked: cols
                        .iter()
                        .map(|&i| {
                            cpu.then(|| r.columns.get(i)?.daemon_cpu.map(|d| d.mean))
                                .flatten()
                        })
                        .collect(),
                })
                .collect()
        };
        let names =
            |cols: &[usize]| -> Vec<&str> { cols.iter().map(|&i| COLUMNS[i].label).collect() };
        grouped_bars(
            &dir.join(format!("{file}-throughput.svg")),
            &format!("Bonnie++ throughput, {title} (MiB/s, more is better)"),
            "MiB/s (log)",
            &names(&io),
            &series(&io, false, 1024.0),
            true,
        )?;
        grouped_bars(
            &dir.join(format!("{file}-cpu.svg")),
            &format!("Bonnie++ CPU, {title} (%, less is better; lighter: compfs daemon's)"),
            "CPU %",
            &names(&all),
            &series(&all, true, 1.0),
            false,
        )?;
        // +++++ everywhere (a fast file system with few files) leaves nothing to draw.
        let f = series(&files, false, 1.0);
        if f.iter().any(|s| s.bars.iter().any(Option::is_some)) {
            grouped_bars(
                &dir.join(format!("{file}-files.svg")),
                &format!("Bonnie++ files, {title} (per second, more is better)"),
                "files/s (log)",
                &names(&files),
                &f,
                true,
            )?;
        }
    }
    Ok(())
}

/// `bench recompress --background --svg`: the store's ratio while the worker runs, and the
/// ratio of writing at the target directly.
pub fn ratio_over_time(
    b: &crate::background::BgReport,
    ratio_direct: f64,
    path: &Path,
) -> Result<()> {
    let root = SVGBackend::new(path, (900, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| failed!("{e}"))?;
    let tmax = b.samples.last().map_or(1.0, |s| s.0).max(0.1) * 1.05;
    let (lo, hi) = b
        .samples
        .iter()
        .fold((ratio_direct, ratio_direct), |(lo, hi), s| {
            (lo.min(s.1), hi.max(s.1))
        });
    let pad = ((hi - lo) * 0.1).max(0.01);
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "compfs background recompression: store ratio over time",
            ("sans-serif", 18),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(55)
        .build_cartesian_2d(0f64..tmax, (lo - pad)..(hi + pad))
        .map_err(|e| failed!("{e}"))?;
    chart
        .configure_mesh()
        .x_desc("seconds since mount")
        .y_desc("ratio (referenced / disk)")
        .draw()
        .map_err(|e| failed!("{e}"))?;
    chart
        .draw_series(LineSeries::new(
            b.samples.iter().map(|s| (s.0, s.1)),
            BLUE.stroke_width(2),
        ))
        .map_err(|e| failed!("{e}"))?
        .label("background worker")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE));
    chart
        .draw_series(LineSeries::new(
            [(0.0, ratio_direct), (tmax, ratio_direct)],
            RED.stroke_width(1),
        ))
        .map_err(|e| failed!("{e}"))?
        .label("written at the target directly")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .border_style(BLACK)
        .background_style(WHITE)
        .draw()
        .map_err(|e| failed!("{e}"))?;
    root.present().map_err(|e| failed!("{e}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pareto_frontier() {
        let pts = [
            (100.0, 3.0),
            (500.0, 2.0),
            (90.0, 2.9),
            (500.0, 1.9),
            (50.0, 3.5),
        ];
        assert_eq!(pareto(&pts), vec![0, 1, 4]);
        assert_eq!(pareto(&[]), Vec::<usize>::new());
    }
}
