"""The study's prose says no more than its tests: a sentence that names a cause cites a finding that may.

docs/results.md's section on the papers' claims is read by people who will repeat it. A
sentence there that names a cause ("the fragility follows the re-centring", "X is why Y",
"due to", "isolates", "separates", "decides", ...) is allowed only if it cites a finding,
as [TASK/SWEEP #N](page), that
  - declares what its arm changes against its reference, one thing (Claim.isolates),
  - holds the rest fixed by measured checks that were met (Claim.needs: HeldFixed, or a
    precondition; the sweep's page says met),
  - and agreed (the page's verdict, the sweep's primary reading).
A cause word under a negation ("was not separated", "nothing here isolates it"), or in a
question or a condition ("whether", "if"), names no cause. Code blocks, tables and the
block the report writes (every finding's numbers) are not prose.
"""

import os
import re

import pytest

from experiments import registry

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS_MD = os.path.join(REPO, "docs", "results.md")
PAGES = os.path.join(REPO, "experiments", "results")
SECTION, NEXT = "## The papers' claims on real training", "## Tests and CI"

CAUSE = re.compile(r"\b(because|follows|followed from|due to|owing to|thanks to|isolat(?:e|es|ed|ing)|"
                   r"separat(?:es|ed|ing)|decid(?:e|es|ed)|settl(?:e|es|ed)|is why|the reason|"
                   r"caus(?:e|es|ed)|explain(?:s|ed)?|driv(?:es|en)|leads? to|led to|responsible for|"
                   r"attribut(?:able|ed))\b", re.IGNORECASE)
NEGATION = re.compile(r"\b(not|no|nor|neither|cannot|never|without|nothing|none)\b|n't\b", re.IGNORECASE)
OPEN = re.compile(r"\b(whether|if)\b", re.IGNORECASE)
CITATION = re.compile(r"\[(\w+)/(\w+) #(\d+)\]")


def prose_sentences(markdown: str) -> list[str]:
    """The sentences of a markdown text, without fenced code, tables, headings and the
    report's generated block; a list item or a paragraph ends a sentence too."""
    markdown = re.sub(r"<!-- findings:begin -->.*?<!-- findings:end -->", "", markdown, flags=re.S)
    markdown = re.sub(r"```.*?```", "\n\n", markdown, flags=re.S)
    blocks, current = [], []
    for line in markdown.splitlines():
        if not line.strip() or line.lstrip().startswith(("|", "#")) or re.match(r"\s*([-*]|\d+\.)\s", line):
            blocks.append(" ".join(current))
            current = [] if not line.strip() or line.lstrip().startswith(("|", "#")) else [line.strip()]
        else:
            current.append(line.strip())
    blocks.append(" ".join(current))
    sentences = []
    for block in blocks:
        # a sentence ends at . ! ? followed by a space and a capital, a bold or a bracket
        sentences += [s.strip() for s in re.split(r"(?<=[.!?])\s+(?=[A-Z*(\[_])", block) if s.strip()]
    return sentences


def named_causes(sentence: str) -> list[str]:
    """The cause words of a sentence that name a cause: not negated in the five words before,
    not in a question or condition opened before them."""
    found = []
    for m in CAUSE.finditer(sentence):
        before = sentence[:m.start()]
        if NEGATION.search(" ".join(before.split()[-5:])) or OPEN.search(before):
            continue
        found.append(m.group(0))
    return found


def citation_problem(task: str, sweep: str, number: int, pages_dir: str = PAGES) -> str | None:
    """None if finding #number of SWEEP on TASK may carry a cause, else why not."""
    if sweep not in registry.SWEEPS:
        return f"no sweep {sweep!r}"
    spec = registry.SWEEPS[sweep](task)
    if not 1 <= number <= len(spec.claims):
        return f"{task}/{sweep} declares {len(spec.claims)} findings, not #{number}"
    claim = spec.claims[number - 1]
    if not claim.isolates:
        return f"{task}/{sweep} #{number} declares no single change (Claim.isolates): its arms differ in more"
    if not claim.needs:
        return f"{task}/{sweep} #{number} holds nothing fixed by a measured check (Claim.needs)"
    page_path = os.path.join(pages_dir, f"sweep_{task}_{sweep}.md")
    if not os.path.isfile(page_path):
        return f"{task}/{sweep} has no page (not run)"
    page = open(page_path).read()
    for need in claim.needs:
        row = next((line for line in page.splitlines() if line.startswith(f"| {need} |")), None)
        if row is None or "**met**" not in row:
            return f"{task}/{sweep} #{number} needs {need!r}, which its page does not show met"
    row = next((line for line in page.splitlines() if line.startswith(f"| {number} | ")), "")
    cells = row.split(" | ")                      # | # | paper | claim | arms | test | n | effect | p | p (Holm) | verdict |
    if "INCOMPLETE" in page or len(cells) < 10 or "**agrees**" not in cells[9]:
        return f"{task}/{sweep} #{number} did not agree (or its sweep is not complete)"
    return None


def problems(markdown: str, pages_dir: str = PAGES) -> list[str]:
    """Every sentence that names a cause without a citation that may carry it, with why."""
    out = []
    for sentence in prose_sentences(markdown):
        words = named_causes(sentence)
        if not words:
            continue
        cites = CITATION.findall(sentence)
        if not cites:
            out.append(f"names a cause ({', '.join(words)}) and cites no finding: {sentence[:200]}")
            continue
        why = [p for t, s, n in cites if (p := citation_problem(t, s, int(n), pages_dir))]
        if len(why) == len(cites):
            out.append(f"names a cause ({', '.join(words)}); {'; '.join(why)}: {sentence[:160]}")
    return out


def study_section() -> str:
    text = open(RESULTS_MD).read()
    return text[text.index(SECTION):text.index(NEXT)]


def test_the_study_prose_names_no_cause_its_findings_do_not_carry():
    found = problems(study_section())
    assert not found, "\n".join(found)


@pytest.mark.parametrize("sentence, flagged", [
    ("The fragility follows the re-centring, not the prompts per step.", True),
    ("That query's split is why it collapses.", True),
    ("The lost mass, due to the re-centring, decides it.", True),
    ("Which of the two did it was not separated.", False),
    ("Nothing here isolates the cancellation.", False),
    ("Whether the cancellation or the lost mass makes large steps fragile is the question.", False),
    ("If masked stays near random, cancellation inside a step is what the fragility follows.", False),
    ("Both arms ended lower at step 10.", False),
])
def test_the_cause_words_are_found_unless_negated_or_open(sentence, flagged):
    assert bool(named_causes(sentence)) is flagged


def test_a_citation_carries_a_cause_only_if_the_finding_isolates_held_what_it_needs_and_agreed(tmp_path):
    """The rule on made-up pages: each condition removed in turn fails the sentence."""
    spec = registry.SWEEPS["masked"]("addition")
    number = next(i for i, c in enumerate(spec.claims, 1) if c.isolates)
    claim = spec.claims[number - 1]
    held = [f"| {need} | random_masked vs x | 40 | 0 | 0 (20 pairs) | - | **met** (tolerance 1e-05) |"
            for need in claim.needs]
    verdict = [f"| {number} | ours | {claim.text} | a vs b | sign-flip | 20 | 0.1 ± 0.01 | 0.0001 | 0.0006 | "
               "**agrees** (80%-power effect 0.05) |"]
    page = tmp_path / "sweep_addition_masked.md"
    sentence = f"The fragility follows the cancellation inside a step [addition/masked #{number}](x.md)."
    page.write_text("\n".join(["# page", *held, *verdict]) + "\n")
    assert problems(sentence, str(tmp_path)) == []
    page.write_text("\n".join(["# page", *[h.replace("**met**", "**NOT MET**") for h in held], *verdict]) + "\n")
    assert "does not show met" in problems(sentence, str(tmp_path))[0]
    page.write_text("\n".join(["# page", *held, verdict[0].replace("**agrees**", "**opposite**")]) + "\n")
    assert "did not agree" in problems(sentence, str(tmp_path))[0]
    # a finding whose arms differ in more than one thing cannot carry a cause, whatever it showed
    plain = next(i for i, c in enumerate(spec.claims, 1) if not c.isolates)
    assert "no single change" in problems(sentence.replace(f"#{number}", f"#{plain}"), str(tmp_path))[0]
    assert "cites no finding" in problems("The fragility follows the re-centring.", str(tmp_path))[0]
