"""Stoker inside the training frameworks people use: one module per framework, imported by name
(``stoker.integrations.transformers``), so that ``import stoker`` never imports a framework.
"""
