"""Making tuned tables: the candidates worth timing (``candidates``), the tuner (``tune``) and the table
commands (``table_tools``: replace, merge, diff).
"""
