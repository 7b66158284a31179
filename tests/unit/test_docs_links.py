"""Every relative link of README.md, docs/ and bench/README.md resolves: the file exists and, for a
``page.md#anchor`` link, the page has a heading with that anchor (GitHub's rule: lower case, spaces to
``-``, punctuation dropped). The README is a map of the operator guide; a moved page must not leave it
pointing nowhere.
"""

import glob
import os
import re

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGES = sorted({os.path.relpath(p, REPO) for p in
                [os.path.join(REPO, "README.md"), os.path.join(REPO, "bench", "README.md")]
                + glob.glob(os.path.join(REPO, "docs", "**", "*.md"), recursive=True)})
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def anchor(heading):
    """GitHub's anchor of a Markdown heading."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path):
    with open(path, encoding="utf-8") as handle:
        text = FENCE.sub("", handle.read())
    return {anchor(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+)$", text, re.M)}


def links(page):
    with open(os.path.join(REPO, page), encoding="utf-8") as handle:
        text = FENCE.sub("", handle.read())
    return [m.group(1) for m in LINK.finditer(text)]


def test_pages_are_found_and_link():
    assert "README.md" in PAGES and "docs/guide/README.md" in PAGES
    assert any(links(page) for page in PAGES)
    assert anchor("Downtime of a rollout: the drain") == "downtime-of-a-rollout-the-drain"
    assert anchor("Tests (`make test`)") == "tests-make-test"


@pytest.mark.parametrize("page", PAGES)
def test_relative_links_resolve(page):
    broken = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, fragment = target.partition("#")
        resolved = os.path.normpath(os.path.join(REPO, os.path.dirname(page), path)) if path else \
            os.path.join(REPO, page)
        if not os.path.exists(resolved):
            broken.append(f"{target}: no file {os.path.relpath(resolved, REPO)}")
        elif fragment and resolved.endswith(".md") and fragment not in anchors(resolved):
            broken.append(f"{target}: {os.path.relpath(resolved, REPO)} has no heading #{fragment}")
    assert not broken, f"{page}: broken links:\n" + "\n".join(broken)
