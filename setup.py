"""Maps the user's top-level folders onto the single import namespace `distronet`.

`node/`, `protocol/`, `coordinator/`, `kernels/` and `dashboard/` install as `distronet.node`,
`distronet.protocol`, ... so nothing installs a generic top-level module called `node`.
`distronet` itself is a PEP 420 namespace package with no folder of its own. Metadata lives in
pyproject.toml; only the package list is computed here, so a new sub-package needs no edit.
"""

from setuptools import find_packages, setup

TOP_LEVEL = ("node", "protocol", "coordinator", "kernels", "dashboard")

setup(
    packages=["distronet." + name for name in find_packages(include=[f"{t}*" for t in TOP_LEVEL])],
    package_dir={"distronet": "."},
    package_data={
        "distronet.dashboard": ["static/*", "static/**/*"],
        "distronet.node.bench": ["*.json"],
    },
)
