//! `index.html`: one self-contained page (no scripts, no external assets):
//! the summary table per config, plots as inline SVG drawn with plotters
//! (category bars, latency histogram, signal rescued per step), the arm
//! table, and the hints side by side per group.

use std::fmt::Write;

use plotters::prelude::*;

use super::arms_html::section_html;
use super::markup::{escape, CONFIG_COLORS, STYLE};
use super::report::{Report, CATEGORIES};

fn config_color(i: usize) -> RGBColor {
    let (r, g, b) = CONFIG_COLORS[i % CONFIG_COLORS.len()];
    RGBColor(r, g, b)
}

fn css_color(i: usize) -> String {
    let (r, g, b) = CONFIG_COLORS[i % CONFIG_COLORS.len()];
    format!("rgb({r},{g},{b})")
}

/// The page.
pub fn render(report: &Report) -> String {
    let mut page = String::new();
    let _ = write!(
        page,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>hintstream eval</title><style>{STYLE}</style></head><body>\n\
         <h1>hintstream eval</h1>\n<p class=\"meta\">{} — {} trajectories, {} groups, {} rejected</p>\n",
        escape(&report.input),
        report.trajectories,
        report.groups,
        report.rejected.values().sum::<u64>()
    );
    if !report.rejected.is_empty() {
        let reasons: Vec<String> = report
            .rejected
            .iter()
            .map(|(k, v)| format!("{} × {v}", escape(k)))
            .collect();
        let _ = writeln!(
            page,
            "<p class=\"meta\">Rejected (would go to the DLQ): {}</p>",
            reasons.join(", ")
        );
    }
    // Without failed trajectories there was no synthesis: the arm table alone.
    let synthesis = !report.configs.is_empty();
    if synthesis {
        summary_table(report, &mut page);
        page.push_str("<h2>Plots</h2>\n<div class=\"plots\">\n");
        let _ = writeln!(
            page,
            "<figure id=\"plot-categories\">{}</figure>",
            category_plot(report)
        );
        let _ = writeln!(
            page,
            "<figure id=\"plot-latency\">{}</figure>",
            latency_plot(report)
        );
        page.push_str("</div>\n");
    }
    outcomes_section(report, &mut page);
    if let Some(arms) = &report.arms {
        section_html(arms, &mut page);
    }
    if synthesis {
        hints_table(report, &mut page);
    }
    page.push_str("</body></html>\n");
    page
}

/// One header cell per config, underlined in its plot color; ends the row.
fn config_headers(report: &Report, page: &mut String) {
    for (i, c) in report.configs.iter().enumerate() {
        let _ = write!(
            page,
            "<th style=\"border-bottom: 4px solid {}\">{}</th>",
            css_color(i),
            escape(&c.label)
        );
    }
    page.push_str("</tr>\n");
}

fn summary_table(report: &Report, page: &mut String) {
    page.push_str("<h2>Summary</h2>\n<table id=\"summary\"><tr><th></th>");
    config_headers(report, page);
    let mut row = |name: &str, cell: &dyn Fn(&super::report::ConfigSummary) -> String, numeric: bool| {
        let _ = write!(page, "<tr><th>{}</th>", escape(name));
        for c in &report.configs {
            let class = if numeric { " class=\"num\"" } else { "" };
            let _ = write!(page, "<td{class}>{}</td>", escape(&cell(c)));
        }
        page.push_str("</tr>\n");
    };
    row("source", &|c| c.source.clone(), false);
    row("prompt version", &|c| c.prompt_version.clone(), false);
    row("concurrency", &|c| c.concurrency.to_string(), true);
    row("system context", &|c| c.system_context.clone(), false);
    row(
        "hints changed vs the first config",
        &|c| c.hints_changed.map_or_else(|| "-".to_string(), |n| n.to_string()),
        true,
    );
    for cat in CATEGORIES {
        let name = cat.as_str();
        row(
            name,
            &|c| c.categories.get(name).copied().unwrap_or(0).to_string(),
            true,
        );
    }
    row(
        "fallback rate",
        &|c| format!("{:.1}%", c.fallback_rate * 100.0),
        true,
    );
    row(
        "failure reasons",
        &|c| {
            c.failure_reasons
                .iter()
                .map(|(k, v)| format!("{k} × {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        },
        false,
    );
    let three = |a: f64, b: f64, c: f64| format!("{a:.0} / {b:.0} / {c:.0}");
    row(
        "latency p50 / p95 / p99 (ms)",
        &|c| three(c.latency_ms.p50, c.latency_ms.p95, c.latency_ms.p99),
        true,
    );
    row(
        "tokens in / out",
        &|c| format!("{} / {}", c.input_tokens, c.output_tokens),
        true,
    );
    row(
        "cached tokens read / written",
        &|c| {
            let shown = |v: Option<u64>| v.map_or_else(|| "-".to_string(), |v| v.to_string());
            format!(
                "{} / {}",
                shown(c.cache_read_input_tokens),
                shown(c.cache_creation_input_tokens)
            )
        },
        true,
    );
    row("cost (USD)", &|c| format!("{:.4}", c.cost_usd), true);
    row(
        "hint length mean / p50 / max (chars)",
        &|c| three(c.hint_chars.mean, c.hint_chars.p50, c.hint_chars.max),
        true,
    );
    row(
        "LLM calls from cassette / API",
        &|c| format!("{} / {}", c.cassette_played, c.api_calls),
        true,
    );
    row("wall time (s)", &|c| format!("{:.2}", c.wall_secs), true);
    page.push_str("</table>\n");
}

/// Draws into an SVG string; a drawing error leaves a note instead.
fn svg(
    size: (u32, u32),
    draw: impl FnOnce(&DrawingArea<SVGBackend<'_>, plotters::coord::Shift>) -> Result<(), String>,
) -> String {
    let mut out = String::new();
    let result = {
        let root = SVGBackend::with_string(&mut out, size).into_drawing_area();
        root.fill(&WHITE)
            .map_err(|e| e.to_string())
            .and_then(|_| draw(&root))
            .and_then(|_| root.present().map_err(|e| e.to_string()))
    };
    match result {
        Ok(()) => out,
        Err(e) => format!("<p>plot unavailable: {}</p>", escape(&e)),
    }
}

/// Grouped bars: x = category, one bar per config.
fn category_plot(report: &Report) -> String {
    let n = report.configs.len().max(1);
    let top = report
        .configs
        .iter()
        .flat_map(|c| c.categories.values())
        .copied()
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    svg((560, 340), |root| {
        let mut chart = ChartBuilder::on(root)
            .caption("Hints per category", ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(48)
            .build_cartesian_2d(0f64..CATEGORIES.len() as f64, 0f64..top * 1.15)
            .map_err(|e| e.to_string())?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(CATEGORIES.len() * 2 + 1)
            .x_label_formatter(&|x| {
                let k = x.floor() as usize;
                if (x.fract() - 0.5).abs() < 1e-6 && k < CATEGORIES.len() {
                    CATEGORIES[k].as_str().to_string()
                } else {
                    String::new()
                }
            })
            .y_desc("groups")
            .draw()
            .map_err(|e| e.to_string())?;
        let width = 0.8 / n as f64;
        for (ci, c) in report.configs.iter().enumerate() {
            let color = config_color(ci);
            chart
                .draw_series(CATEGORIES.iter().enumerate().map(|(k, cat)| {
                    let x0 = k as f64 + 0.1 + ci as f64 * width;
                    let count = c.categories.get(cat.as_str()).copied().unwrap_or(0) as f64;
                    Rectangle::new([(x0, 0.0), (x0 + width, count)], color.filled())
                }))
                .map_err(|e| e.to_string())?
                .label(c.label.clone())
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(|e| e.to_string())
    })
}

/// Latency histograms on one scale, one outlined series per config.
fn latency_plot(report: &Report) -> String {
    let top_ms = report
        .configs
        .iter()
        .filter_map(|c| c.latency_histogram.last().map(|b| b.to))
        .fold(1.0, f64::max);
    let top_count = report
        .configs
        .iter()
        .flat_map(|c| c.latency_histogram.iter().map(|b| b.count))
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    svg((560, 340), |root| {
        let mut chart = ChartBuilder::on(root)
            .caption("Hint latency", ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(48)
            .build_cartesian_2d(0f64..top_ms, 0f64..top_count * 1.15)
            .map_err(|e| e.to_string())?;
        chart
            .configure_mesh()
            .x_desc("ms")
            .y_desc("groups")
            .draw()
            .map_err(|e| e.to_string())?;
        for (ci, c) in report.configs.iter().enumerate() {
            let color = config_color(ci);
            chart
                .draw_series(c.latency_histogram.iter().filter(|b| b.count > 0).map(|b| {
                    Rectangle::new([(b.from, 0.0), (b.to, b.count as f64)], color.mix(0.45).filled())
                }))
                .map_err(|e| e.to_string())?
                .label(c.label.clone())
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(|e| e.to_string())
    })
}

fn outcomes_section(report: &Report, page: &mut String) {
    let Some(o) = &report.outcomes else {
        return;
    };
    let _ = writeln!(
        page,
        "<h2>Hints in training</h2>\n<p class=\"meta\">From {} recorded scored rollouts ({} rejected), computed by stage 2: {} groups' signal rescued.</p>",
        o.rows,
        o.rejected.values().sum::<u64>(),
        o.signal_rescued
    );
    page.push_str("<table id=\"outcomes\"><tr><th>category</th><th>hinted rollouts</th><th>successes</th><th>success rate</th></tr>\n");
    for (name, c) in &o.by_category {
        let _ = writeln!(
            page,
            "<tr><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{:.1}%</td></tr>",
            escape(name),
            c.hinted_rollouts,
            c.successes,
            c.success_rate * 100.0
        );
    }
    page.push_str("</table>\n<table id=\"steps\"><tr><th>run / step</th><th>rows</th><th>groups rescued</th><th>hint success rate</th></tr>\n");
    // A step without hinted rows has neither metric: shown as a dash.
    let metric = |s: &super::report::StepOutcome, name: &str, percent: bool| {
        s.metrics.get(name).map_or_else(
            || "–".to_string(),
            |v| {
                if percent {
                    format!("{:.1}%", v * 100.0)
                } else {
                    v.to_string()
                }
            },
        )
    };
    for s in &o.steps {
        let _ = writeln!(
            page,
            "<tr><td>{} / {}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td></tr>",
            escape(&s.run_id),
            s.step,
            s.rows,
            metric(s, "hint/signal_rescued_count", false),
            metric(s, "hint/hint_success_rate", true)
        );
    }
    page.push_str("</table>\n");
}

fn hints_table(report: &Report, page: &mut String) {
    page.push_str("<h2>Hints side by side</h2>\n<table id=\"hints\"><tr><th>group</th><th>best reward</th><th>verifier error</th>");
    config_headers(report, page);
    for g in &report.hints {
        let _ = write!(
            page,
            "<tr><td>{}<br><span class=\"meta\">{} trajectories</span></td><td class=\"num\">{}</td><td class=\"hint\">{}</td>",
            escape(&g.key),
            g.members,
            g.best_reward,
            escape(g.verifier_error.as_deref().unwrap_or(""))
        );
        for h in &g.hints {
            let reason = h
                .failure_reason
                .as_deref()
                .map(|r| format!(" ({})", escape(r)))
                .unwrap_or_default();
            let _ = write!(
                page,
                "<td class=\"hint\"><span class=\"cat\">{}{reason}</span> {}</td>",
                h.category.as_str(),
                escape(&h.hint)
            );
        }
        page.push_str("</tr>\n");
    }
    page.push_str("</table>\n");
}
