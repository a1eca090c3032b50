"""The analysis package never imports torch, directly or through what it uses, and importing it
loads none of pandas, scikit-learn and matplotlib (its names load on first use)."""

import pkgutil
import subprocess
import sys
import textwrap

import latentcode.analysis
from tests.analysis.synthetic import write_codes


def test_analysis_modules_and_a_small_run_leave_torch_unimported(tmp_path):
    path = write_codes(tmp_path / "codes.h5", n_per_split={"train": 40, "ood": 20}, planted=("rule",))
    modules = [f"latentcode.analysis.{info.name}" for info in pkgutil.iter_modules(latentcode.analysis.__path__)]
    assert {"latentcode.analysis.probes", "latentcode.analysis.plots"} <= set(modules)
    script = textwrap.dedent(f"""
        import importlib, sys
        for name in {modules!r} + ["umap", "sklearn.manifold"]:  # umap and tSNE load lazily
            importlib.import_module(name)
        from latentcode.analysis import decode, embed, plot_similarity
        decode({str(path)!r}, "rule", layers=[1], cv=2, Cs=[1.0])
        embed({str(path)!r}, "tsne", split="ood", layers=[1])
        plot_similarity({str(path)!r}, "rule", {str(tmp_path / "heatmap")!r})
        loaded = sorted(name for name in sys.modules if name == "torch" or name.startswith("torch."))
        print("torch modules:", loaded)
        sys.exit(1 if loaded else 0)
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "torch modules: []" in result.stdout


def test_importing_the_package_loads_no_pandas_scikit_learn_or_matplotlib():
    # Its names load on first use; `embed`, the name of a function and of its module, is the function
    # even after the module is first imported by something else (here the plots).
    script = textwrap.dedent("""
        import sys
        import latentcode.analysis
        print("loaded:", sorted(name for name in ("sklearn", "matplotlib", "pandas", "torch") if name in sys.modules))
        import latentcode.analysis.plots
        from latentcode.analysis import embed, plot_embedding
        print("embed:", type(embed).__name__, "plot_embedding:", type(plot_embedding).__name__)
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "loaded: []" in result.stdout
    assert "embed: function plot_embedding: function" in result.stdout


def test_every_public_name_is_the_object_its_module_defines():
    import importlib

    for name in latentcode.analysis.__all__:
        module = importlib.import_module(latentcode.analysis._WHERE[name])
        assert getattr(latentcode.analysis, name) is getattr(module, name), name
    assert sorted(dir(latentcode.analysis)) == sorted(latentcode.analysis.__all__)
