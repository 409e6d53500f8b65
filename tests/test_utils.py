"""draw_diagram: boxes where asked, arrows clipped to the box outlines, clear errors."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from matplotlib.path import Path as MplPath  # noqa: E402

from tlm.utils import draw_diagram  # noqa: E402


def _diagram():
    fig, ax = plt.subplots()
    boxes = {"a": (0, 0, "start box"), "b": (0, 3, "end box", "#dfd"), "sum": (1, 1.5, "+")}
    texts = draw_diagram(ax, boxes, [("a", "b", "label"), ("a", "sum", "", 0.3)], title="t")
    ax.set(xlim=(-2, 2), ylim=(-1, 4))
    fig.canvas.draw()
    return fig, ax, texts


def test_boxes_are_placed_and_styled():
    fig, ax, texts = _diagram()
    assert set(texts) == {"a", "b", "sum"}
    assert texts["b"].get_position() == (0, 3)
    assert texts["b"].get_bbox_patch().get_facecolor()[:3] == pytest.approx((0xDD / 255, 1.0, 0xDD / 255))
    assert type(texts["sum"].get_bbox_patch().get_boxstyle()).__name__ == "Circle"
    assert type(texts["a"].get_bbox_patch().get_boxstyle()).__name__ == "Round"
    assert not ax.axison and ax.get_title() == "t"
    plt.close(fig)


def test_arrows_end_on_the_box_outlines():
    fig, ax, texts = _diagram()
    arrow = next(t for t in ax.texts if getattr(t, "arrow_patch", None) is not None)
    path = arrow.arrow_patch.get_path()  # display coordinates, once drawn
    drawn = path.codes != MplPath.CLOSEPOLY if path.codes is not None else slice(None)
    ys = path.vertices[drawn, 1]
    start_box = texts["a"].get_bbox_patch().get_window_extent()
    end_box = texts["b"].get_bbox_patch().get_window_extent()
    # from the top edge of "a" to the bottom edge of "b", not centre to centre
    assert ys.min() == pytest.approx(start_box.y1, abs=1.5)
    assert ys.max() == pytest.approx(end_box.y0, abs=3.0)
    assert ys.min() > texts["a"].get_window_extent().y0
    plt.close(fig)


def test_unknown_box_name_is_a_clear_error():
    fig, ax = plt.subplots()
    with pytest.raises(ValueError, match="no box named 'c'"):
        draw_diagram(ax, {"a": (0, 0, "a")}, [("a", "c")])
    plt.close(fig)
