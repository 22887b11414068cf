"""BERT on Mesh TensorFlow: the original's `mesh_tensorflow.bert`.

`bert` (BertConfig, BertModel), `optimization` (create_optimizer),
`tokenization` (FullTokenizer and an in-graph twin on tensorflow-text),
`create_pretraining_data` (text file -> pretraining TFRecords) and three
absl-flag binaries: `run_pretraining`, `run_classifier`, `run_squad`.
The binaries run on the placement mesh implementation over logical CPUs
(or GPUs) by default and on TPU cores with `--use_tpu`. The model
configurations of the original ship as package data under `config/`.
"""
