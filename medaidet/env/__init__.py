"""The environment (notebook 00): the doctor, Colab setup and the papermill course runner."""
