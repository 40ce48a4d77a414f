"""A report page read back as elements, with the standard library's HTML parser: each element's tag,
attributes, text (its own and its children's) and parent, in document order. The tests read the page
as written and the DOM Chromium serialises (``--dump-dom``) the same way."""

from __future__ import annotations

from dataclasses import dataclass, field
from html.parser import HTMLParser

#: Elements that have no end tag.
VOID = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"})


@dataclass
class Element:
    tag: str
    attrs: dict[str, str]
    parent: "Element | None"
    text: list[str] = field(default_factory=list)

    @property
    def content(self) -> str:
        """Its text and its descendants', whitespace collapsed."""
        return " ".join("".join(self.text).split())

    def within(self, other: "Element") -> bool:
        node = self.parent
        while node is not None:
            if node is other:
                return True
            node = node.parent
        return False

    def has_class(self, name: str) -> bool:
        return name in self.attrs.get("class", "").split()


class _Outline(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[Element] = []
        self.stack: list[Element] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        el = Element(tag, {k: v or "" for k, v in attrs}, self.stack[-1] if self.stack else None)
        self.elements.append(el)
        if tag not in VOID:
            self.stack.append(el)

    def handle_endtag(self, tag: str) -> None:
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i].tag == tag:
                del self.stack[i:]
                break

    def handle_data(self, data: str) -> None:
        for el in self.stack:
            el.text.append(data)


def outline(html: str) -> list[Element]:
    """Every element of ``html`` in document order."""
    parser = _Outline()
    parser.feed(html)
    parser.close()
    return parser.elements


def find(elements: list[Element], tag: str | None = None, *, cls: str | None = None, **attrs: str) -> list[Element]:
    """The elements of ``tag`` (any when None) with class ``cls`` and the attributes given (``data_x``
    for ``data-x``), in document order."""
    want = {k.replace("_", "-"): v for k, v in attrs.items()}
    return [e for e in elements if (tag is None or e.tag == tag) and (cls is None or e.has_class(cls))
            and all(e.attrs.get(k) == v for k, v in want.items())]
