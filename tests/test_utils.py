"""draw_diagram: boxes where asked, arrows clipped to the box outlines, clear errors."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
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


# The argument checks: a TypeError for the wrong kind of value, a ValueError for a value of the
# right kind that is out of range; the message names the argument and what came.
@pytest.mark.parametrize("value, error, match", [
    ("1e-5", TypeError, "eps must be a positive number, got str '1e-5'"),
    (None, TypeError, "eps must be a positive number, got NoneType None"),
    (True, TypeError, "eps must be a positive number, got bool True"),
    (0, ValueError, "eps must be a positive finite number, got 0.0"),
    (-1.0, ValueError, "eps must be a positive finite number, got -1.0"),
    (float("inf"), ValueError, "eps must be a positive finite number, got inf"),
])
def test_check_positive_float(value, error, match):
    from tlm.utils import _check_positive_float
    with pytest.raises(error, match=match):
        _check_positive_float("eps", value)


def test_check_positive_float_accepts_ints_and_floats():
    from tlm.utils import _check_positive_float
    assert _check_positive_float("eps", 1e-5) == 1e-5
    assert _check_positive_float("theta", 10_000) == 10_000.0
    assert type(_check_positive_float("theta", 10_000)) is float


def test_check_int():
    from tlm.utils import _check_int, _check_positive_int
    assert _check_int("warmup", 0, minimum=0) == 0 and _check_positive_int("d", 3) == 3
    with pytest.raises(TypeError, match="d_model must be a positive int, got float 4.0"):
        _check_positive_int("d_model", 4.0)
    with pytest.raises(TypeError, match="warmup must be an int >= 0, got bool False"):
        _check_int("warmup", False, minimum=0)
    with pytest.raises(ValueError, match="warmup must be an int >= 0, got -1"):
        _check_int("warmup", -1, minimum=0)


def test_replace_atomically_refuses_what_is_not_a_file(tmp_path):
    """`--out /dev/stdout` replaced the device's link by a file (as root); a folder was
    an errno line naming a temporary file. Refused, the path untouched."""
    from tlm.utils import _replace_atomically
    (tmp_path / "folder").mkdir()
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "link").symlink_to("/dev/null")
    for name in ("folder", "pipe", "link"):
        with pytest.raises(OSError, match=rf"^cannot write {re.escape(str(tmp_path / name))}"
                                          r": it is not a file \(a folder, a device or a "
                                          r"pipe\); choose a file$"):
            with _replace_atomically(tmp_path / name) as f:
                f.write(b"ids")
    assert (tmp_path / "folder").is_dir() and (tmp_path / "pipe").is_fifo()
    assert os.readlink(tmp_path / "link") == "/dev/null"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder", "link", "pipe"]


def test_replace_atomically_keeps_the_old_file_after_a_failure(tmp_path):
    import os

    from tlm.utils import _replace_atomically
    target = tmp_path / "f.bin"
    with _replace_atomically(target) as f:
        f.write(b"old")
    with pytest.raises(RuntimeError, match="half-way"):
        with _replace_atomically(target) as f:
            f.write(b"new and longer")
            raise RuntimeError("half-way")
    assert target.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["f.bin"]
    with _replace_atomically(target, "w") as f:
        f.write("text, é")
    assert target.read_text(encoding="utf-8") == "text, é"
    mask = os.umask(0)
    os.umask(mask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~mask


@pytest.mark.parametrize("how", ["OSError", "inside torch.save"])
def test_a_failed_write_names_the_file_and_keeps_the_old_one(tmp_path, how):
    """A full disk: write() raises an OSError that names no file; torch.save's zip
    writer raises a RuntimeError in its handling."""
    import errno

    from tlm.utils import _replace_atomically
    target = tmp_path / "checkpoint.pt"
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    for before, kept in ((None, "none was kept"), (b"old", "the previous checkpoint.pt "
                                                   "is kept")):
        if before is not None:
            target.write_bytes(before)
        with pytest.raises(OSError) as error:
            with _replace_atomically(target) as f:
                f.write(b"new")
                if how == "OSError":
                    raise full
                try:
                    raise full
                except OSError:
                    raise RuntimeError("unexpected pos 163008 vs 162896")
        assert str(error.value) == (f"cannot write {target}: No space left on device "
                                    f"({kept})")
        assert error.value.errno == errno.ENOSPC
        assert (target.read_bytes() if target.exists() else None) == before
        assert [p.name for p in tmp_path.iterdir()] == ([] if before is None
                                                        else ["checkpoint.pt"])
    with pytest.raises(FileNotFoundError):  # an error that names its file: as it was
        with _replace_atomically(target) as f:
            f.write((tmp_path / "no-such-file").read_bytes())


def test_saved_tensor_bytes_leaves_out_parameters_and_their_views():
    import torch
    import torch.nn.functional as F

    from tlm import Linear, saved_tensor_bytes
    x = torch.randn(3, 10, requires_grad=True)
    w = torch.nn.Parameter(torch.randn(20, 10))
    x_bytes = 3 * 10 * 4  # only the input: the weight exists anyway
    assert saved_tensor_bytes(lambda: x @ w.T) == x_bytes
    assert saved_tensor_bytes(lambda: F.linear(x, w)) == x_bytes
    layer = Linear(10, 20)
    assert saved_tensor_bytes(lambda: layer(x)) == x_bytes
    plain = torch.randn(20, 10, requires_grad=True)  # not a parameter: counted
    assert saved_tensor_bytes(lambda: x @ plain.T) == x_bytes + 20 * 10 * 4


def test_get_device_warms_cuda_for_notebooks_but_not_for_tlm_train(monkeypatch):
    """A notebook's device runs one backward pass on CUDA (so that autograd's CUDA thread
    has a context before a cell's first backward); `tlm train` must not touch CUDA before
    `--deterministic` has set cuBLAS's workspace, so its device is not warmed."""
    import tlm.runtime
    import tlm.utils
    warmed = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # one GPU
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(tlm.utils, "_start_backward_thread", warmed.append)
    monkeypatch.delenv("TLM_DEVICE", raising=False)
    assert tlm.get_device() == torch.device("cuda") and warmed == [torch.device("cuda")]
    assert tlm.get_device("cuda:0", warm=False) == torch.device("cuda:0")
    assert tlm.runtime._device("cuda") == torch.device("cuda")
    with pytest.raises(ValueError, match=r"^device: cuda:1 is not available here \(this "
                       r"machine has 1 GPU\)$"):
        tlm.runtime._device("cuda:1")
    assert tlm.get_device("cpu") == torch.device("cpu")
    assert warmed == [torch.device("cuda")]  # only the first call


def test_values_checked_once_nests_and_restores():
    """Inside, value ranges are not read; leaving an inner block keeps the outer one off;
    after the outer one (also after an error) they are read again."""
    from tlm.utils import _check_index_tensor, _values_checked_once
    bad = torch.tensor([5])
    with _values_checked_once():
        with _values_checked_once():
            _check_index_tensor("ids", bad, 3, "vocab_size")
        _check_index_tensor("ids", bad, 3, "vocab_size")  # still off
        with pytest.raises(TypeError):  # types are still checked
            _check_index_tensor("ids", torch.tensor([0.5]), 3, "vocab_size")
    with pytest.raises(ValueError, match=r"ids must lie in \[0, vocab_size=3\)"):
        _check_index_tensor("ids", bad, 3, "vocab_size")
    with pytest.raises(RuntimeError), _values_checked_once():
        raise RuntimeError
    with pytest.raises(ValueError):
        _check_index_tensor("ids", bad, 3, "vocab_size")
