//! The view's HTML page: a template with the page's style and script, the
//! vendored chart library (uPlot, its licence alongside) and the data, all
//! compiled into the binary and inlined, so the page works offline.
//!
//! The assets live in `crates/gpumem-cli/assets/view/`: `page.html` (the
//! template), `view.css`, `view.js` (the page's own code) and `uplot/`
//! (uPlot's minified build and stylesheet as published on npm, and its
//! LICENSE).

use anyhow::{bail, Result};

use super::ViewData;

/// The uPlot release vendored in `assets/view/uplot/`.
pub const UPLOT_VERSION: &str = "1.6.32";

const TEMPLATE: &str = include_str!("../../assets/view/page.html");
const VIEW_CSS: &str = include_str!("../../assets/view/view.css");
const VIEW_JS: &str = include_str!("../../assets/view/view.js");
const UPLOT_JS: &str = include_str!("../../assets/view/uplot/uPlot.iife.min.js");
const UPLOT_CSS: &str = include_str!("../../assets/view/uplot/uPlot.min.css");
const UPLOT_LICENSE: &str = include_str!("../../assets/view/uplot/LICENSE");

/// Escapes text for HTML content and attribute values.
fn escape_html(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Text that goes inside a `<script>` or `<style>` element must not close
/// it early.
fn check_inline(name: &str, text: &str) -> Result<()> {
    let lower = text.to_ascii_lowercase();
    if lower.contains("</script") || lower.contains("</style") || lower.contains("<!--") {
        bail!("the page's asset {name} cannot be inlined: it holds a closing tag");
    }
    Ok(())
}

/// The page for `data`, as one HTML document.
pub fn render(data: &ViewData) -> Result<String> {
    for (name, text) in [
        ("view.css", VIEW_CSS),
        ("view.js", VIEW_JS),
        ("uPlot.iife.min.js", UPLOT_JS),
        ("uPlot.min.css", UPLOT_CSS),
    ] {
        check_inline(name, text)?;
    }
    // JSON inside a script element: `<` escaped as \u003c keeps any
    // `</script>` in a file name or stack frame from closing it.
    let json = serde_json::to_string(data)?.replace('<', "\\u003c");
    let licence = escape_html(UPLOT_LICENSE).replace("--", "- -");
    let parts: [(&str, &str); 7] = [
        ("{{TITLE}}", &escape_html(&data.title)),
        ("{{UPLOT_VERSION}}", UPLOT_VERSION),
        ("{{UPLOT_LICENSE}}", &licence),
        ("{{UPLOT_CSS}}", UPLOT_CSS),
        ("{{VIEW_CSS}}", VIEW_CSS),
        ("{{UPLOT_JS}}", UPLOT_JS),
        ("{{VIEW_JS}}", VIEW_JS),
    ];
    // One pass over the template: what is put in is never searched again.
    let mut out = String::with_capacity(TEMPLATE.len() + json.len() + UPLOT_JS.len() * 2);
    let mut rest = TEMPLATE;
    while let Some(at) = rest.find("{{") {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        if let Some(t) = tail.strip_prefix("{{DATA}}") {
            out.push_str(&json);
            rest = t;
            continue;
        }
        match parts.iter().find(|(k, _)| tail.starts_with(k)) {
            Some((k, v)) => {
                out.push_str(v);
                rest = &tail[k.len()..];
            }
            None => bail!(
                "the page template has an unknown placeholder at {}",
                &tail[..tail.len().min(20)]
            ),
        }
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes() {
        assert_eq!(
            escape_html("<a href=\"x\">&'"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
        assert!(check_inline("x", "a < b").is_ok());
        assert!(check_inline("x", "'</SCRIPT>'").is_err());
    }

    #[test]
    fn assets_inline_cleanly() {
        for text in [VIEW_CSS, VIEW_JS, UPLOT_JS, UPLOT_CSS] {
            assert!(check_inline("asset", text).is_ok());
        }
        assert!(UPLOT_LICENSE.contains("MIT"));
    }
}
