"""The evaluation protocol in numbers: match IoU, score thresholds, the course's results.

Plain constants, no NumPy or chainer: the command line builds its parsers from them first.
"""

__all__ = ["IOU_THRESH", "EVALUATE_SCORE_THRESH", "COURSE_SCORE_THRESH", "PROTOCOLS",
           "COURSE_PUBLISHED", "COUNT_SCORE_THRESH"]

#: A detection matches a box when their IoU is at least this (VOC).
IOU_THRESH = 0.5
#: Score threshold of ChainerCV's 'evaluate' preset: the lowest score a prediction keeps.
EVALUATE_SCORE_THRESH = 0.01
#: Score threshold of the 'visualize' preset, which the course evaluated with.
COURSE_SCORE_THRESH = 0.6
#: Protocol name -> score threshold. Both are scored from the same predictions.
PROTOCOLS = {"evaluate": EVALUATE_SCORE_THRESH, "course": COURSE_SCORE_THRESH}
#: The course's published test numbers (VOC area AP, score >= 0.6, 72 images).
COURSE_PUBLISHED = {"map": 0.719, "ap": {"rbc": 0.760, "wbc": 0.965, "platelets": 0.432}}
#: Cells are counted from the detections scoring at least this (``medaidet count``'s default).
COUNT_SCORE_THRESH = 0.5
