TITLE AMPA receptor of Raman & Trussell (1992), scheme 1, with a Q10 temperature factor

COMMENT
Test fixture for kingen's NMODL import, written for kingen in the style of cnmodel's
mechanisms. Scheme and rate constants (at 22 degC): Raman IM, Trussell LO (1992) The
kinetics of the response to glutamate and kainate in neurons of the avian cochlear
nucleus, Neuron 9:173-186 (as in cnmodel ampa_trussell.mod: Q10 = 1.5, Erev = +7 mV).
Every rate is scaled by qfac = Q10^((celsius - 22)/10): a temperature factor that kingen
imports as the scheme's Q10 (one group of all the rates, reference 22 degC).
ENDCOMMENT

NEURON {
    POINT_PROCESS AMPATRU
    RANGE Rb, Ru1, Ru2, Rd, Rr, Ro1, Rc1, Ro2, Rc2, g, gmax, XMTR
    NONSPECIFIC_CURRENT i
}

UNITS {
    (nA) = (nanoamp)
    (mV) = (millivolt)
    (pS) = (picosiemens)
    (mM) = (milli/liter)
}

PARAMETER {
    Erev = 7     (mV)
    gmax = 10    (pS)
    Q10  = 1.5
    Rb   = 13    (/mM /ms)
    Ru1  = 0.3   (/ms)
    Ru2  = 200   (/ms)
    Rd   = 30    (/ms)
    Rr   = 0.02  (/ms)
    Ro1  = 100   (/ms)
    Rc1  = 2     (/ms)
    Ro2  = 2     (/ms)
    Rc2  = 0.25  (/ms)
    XMTR = 0     (mM)
}

ASSIGNED {
    v (mV)
    i (nA)
    g (pS)
    celsius (degC)
    qfac (1)
}

STATE { C0 C1 C2 D O1 O2 }

INITIAL {
    qfac = Q10^((celsius - 22)/10)
    C0 = 1
}

BREAKPOINT {
    SOLVE kstates METHOD sparse
    g = gmax * (O1 + O2)
    i = (1e-6) * g * (v - Erev)
}

KINETIC kstates {
    ~ C0 <-> C1 (qfac*Rb*XMTR, qfac*Ru1)
    ~ C1 <-> C2 (qfac*Rb*XMTR, qfac*Ru2)
    ~ C2 <-> D  (qfac*Rd, qfac*Rr)
    ~ C2 <-> O1 (qfac*Ro1, qfac*Rc1)
    ~ C2 <-> O2 (qfac*Ro2, qfac*Rc2)
    CONSERVE C0 + C1 + C2 + D + O1 + O2 = 1
}
