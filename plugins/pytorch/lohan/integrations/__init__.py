"""Adapters from training frameworks to lohan; each imports its framework
only when used (`from lohan.integrations.transformers import
LohanTrainer`)."""
