"""The recurrent cells, compiled by Numba: shared pieces in ops.py, one module per cell
(elman, gru, lstm) with its batch kernel, and step.py, which dispatches a batch to its cell.
A new cell is one module here, its code in model/params.py and its branch in step.py."""
