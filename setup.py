"""Installs Mesh TensorFlow for TensorFlow 2."""

import setuptools

setuptools.setup(
    name="mesh-tensorflow-tf2",
    version="0.2.0",
    description=("Mesh TensorFlow: named-dimension distributed tensor "
                 "computation, re-created for TensorFlow 2."),
    license="Apache 2.0",
    python_requires=">=3.10",
    packages=(["mesh_tensorflow", "mesh_tensorflow.ops",
               "mesh_tensorflow.estimator",
               "mesh_tensorflow.transformer"]),
    package_dir={
        "mesh_tensorflow": "mesh_tensorflow",
        "mesh_tensorflow.transformer": "transformer",
    },
    # The original's gin configs (defaults.gin, models/, layouts/, ...).
    package_data={
        "mesh_tensorflow.transformer": ["gin/*.gin", "gin/*/*.gin"],
    },
    install_requires=[
        "tensorflow>=2.16",
        "tensorflow-text",
        "tensorflow-datasets",
        "absl-py",
        "numpy",
        "gin-config",
    ],
    extras_require={
        "test": ["pytest", "pytest-xdist", "sentencepiece"],
    },
)
